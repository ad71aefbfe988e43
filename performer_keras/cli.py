"""What every command-line tool shares: one-line errors and Ctrl-C.

The promise of every tool (README, "What a kill costs"): bad input exits 2
with exactly one line on stderr, and Ctrl-C exits 130 with one line.
"""

import argparse
import sys

INTERRUPTED = 130


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, not the whole usage block: "prog: error: ... (see --help)"."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def fail(prog, message, status=2):
    """Print "prog: error: message" as one line on stderr and return `status`."""
    print(f"{prog}: error: {' '.join(str(message).split())}", file=sys.stderr)
    return status


def interruptible(prog, function):
    """`function()`'s exit status; Ctrl-C gives one line and 130 instead of a traceback.

    Whatever was finished is already on disk (every write is atomic), so the
    same command resumes.
    """
    try:
        return function()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; run the same command again to resume", file=sys.stderr)
        return INTERRUPTED
