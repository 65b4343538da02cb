"""The argparse action the repeatable name flags share: ``--allow-operator``,
``--allow-tester`` (`ppre.commands.add_names_argument`) and ``--column``
(`ppre.columns`). The configuration's settings table (`ppre.config.table`) reads a flag
with this action as a list of names. It imports nothing of ours.
"""
from __future__ import annotations

import argparse


class RepeatedNames(argparse.Action):
    """A repeatable NAME[,NAME...] option whose first use replaces its default (an env
    variable or the development identity) instead of adding to it."""

    def __call__(self, parser, namespace, values, option_string=None):
        current = getattr(namespace, self.dest, None)
        current = list(current) if isinstance(current, list) and current is not self.default else []
        current.append(values)
        setattr(namespace, self.dest, current)
