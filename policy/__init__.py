"""autoheal's CrossGuard policy pack; the rules live in `policy.rules` (plain functions, testable)."""
