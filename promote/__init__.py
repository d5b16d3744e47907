"""Gated model promotion: candidate -> gates -> version N+1 -> canary -> full traffic, or rollback."""
