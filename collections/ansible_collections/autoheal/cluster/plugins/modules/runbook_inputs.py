#!/usr/bin/python
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: runbook_inputs
short_description: Check a runbook's inputs, fill in their defaults and make their paths absolute
description:
  - The first step of every autoheal runbook play. The play's inputs are variables (extra vars
    from the runner, C(-e) from an engineer); this validates those named in O(argument_spec) as
    M(ansible.builtin.validate_argument_spec) does, and applies the spec's defaults.
  - C(autoheal_nodes) must be unique node names of the Kubernetes/Slurm grammar and
    C(autoheal_incident_ids) incident ids (letters, digits, C(_.:-)); anything else fails the play
    before any step runs.
  - >-
    C(autoheal_slurm_conf), C(autoheal_kubeconfig), C(autoheal_journal_events) and
    C(autoheal_lab_root) are made absolute from the directory C(ansible-playbook) was started in
    (modules run elsewhere, so a relative path would be read from the wrong place); a path that
    does not exist fails the play with a message naming the input and the fix.
  - >-
    Sets the fact C(autoheal_run) - every input without its C(autoheal_) prefix, and
    C(incidents) (node to incident id, C(manual) when none was given), C(incident_list),
    C(use_kube) (a kubeconfig was given) and C(backend) (the replacement backend - C(lab) when a
    lab name was given, else C(none), unless C(autoheal_backend) says).
  - This module runs on the controller only (it is an action plugin).
version_added: 0.2.0
author: autoheal maintainers (@autoheal-project)
options:
  argument_spec:
    description: The play's argument spec (an entry of C(playbooks/specs/inputs.yml)).
    type: dict
    required: true
extends_documentation_fragment:
  - autoheal.cluster.attributes
  - autoheal.cluster.attributes.action
"""

EXAMPLES = r"""
- name: Check the inputs and fill in the defaults
  autoheal.cluster.runbook_inputs:
    argument_spec: "{{ (lookup('ansible.builtin.file', 'specs/inputs.yml') | from_yaml).fence }}"

- name: Fence the nodes
  autoheal.cluster.fence:
    nodes: "{{ autoheal_run.nodes }}"
    incident_ids: "{{ autoheal_run.incident_list }}"
    reason: manual fence
    slurm_conf: "{{ autoheal_run.slurm_conf }}"
"""

RETURN = r"""
ansible_facts:
  description: C(autoheal_run), the checked inputs and what the steps derive from them.
  returned: success
  type: dict
  sample:
    autoheal_run:
      nodes: [gpu-2]
      incidents: {gpu-2: manual}
      incident_list: [manual]
      slurm_conf: /srv/autoheal/.lab/default/slurm/slurm.conf
      kubeconfig: /srv/autoheal/.lab/default/kubeconfig
      use_kube: true
      backend: none
"""
