"""An ``inferctl`` subcommand as data: its name, what ``--help`` says of it, its options, its handler.

:mod:`inferctl.cli` makes every subcommand's parser from one of these, the one way.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Command"]


@dataclass(frozen=True, kw_only=True)
class Command:
    """One subcommand. A text given as a function is made when the parser is: it may need modules
    that merely importing the command's module should not load.

    Attributes:
        epilog: shown after the options, as written (the description too is then kept as written).
    """

    name: str
    help: str
    description: str | Callable[[], str]
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    epilog: Callable[[], str] | None = None

    def register(self, sub: argparse._SubParsersAction) -> None:
        """Add this command's parser to ``sub``; parsing it sets ``handler`` to :attr:`run`."""
        described = self.description if isinstance(self.description, str) else self.description()
        epilog = None if self.epilog is None else self.epilog()
        # an epilog is a listing laid out by hand: argparse must not refill it
        layout = argparse.HelpFormatter if epilog is None else argparse.RawDescriptionHelpFormatter
        parser = sub.add_parser(
            self.name, help=self.help, description=described, epilog=epilog, formatter_class=layout
        )
        self.add_arguments(parser)
        parser.set_defaults(handler=self.run)
