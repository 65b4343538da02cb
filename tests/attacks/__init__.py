"""Attacks on the released aggregates by a curious Test-Client (design §8.1)."""
