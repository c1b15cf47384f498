# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""The attributes of the autoheal.cluster modules. Every module supports check mode and runs on
POSIX hosts (DOCUMENTATION); they differ in diff mode and in whether an action plugin does the
work (one of the others, listed beside it)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
attributes:
    check_mode:
      description: Can run in check mode and report what would change, changing nothing.
      support: full
    platform:
      description: Target OS/families that can be operated against.
      support: N/A
      platforms: posix
"""

    # changes state, with diff mode
    DIFF = r"""
attributes:
    diff_mode:
      description: Returns the state before and after for the nodes it changes.
      support: full
"""

    # changes state, without diff mode
    NO_DIFF = r"""
attributes:
    diff_mode:
      description: Would return the state before and after.
      support: none
"""

    # reads only
    INFO = r"""
attributes:
    diff_mode:
      description: Not applicable - it changes nothing.
      support: N/A
"""

    # done by an action plugin in the controller
    ACTION = r"""
attributes:
    diff_mode:
      description: Would return the state before and after.
      support: none
    action:
      description: An action plugin of the same name does the work in the controller.
      support: full
    async:
      description: Can run with the C(async) keyword.
      support: none
    bypass_host_loop:
      description: Runs once for all hosts.
      support: none
"""
