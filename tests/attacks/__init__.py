"""Attacks on the released aggregates by a curious Test-Client (issue point 4; SPEC.md section 8)."""
