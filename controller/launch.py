"""The `atoll` command's entry point, kept free of imports: a Ctrl-C while Atoll's own modules load
(a second or more on a busy machine) is one line, never a traceback through pydantic or tomllib."""
import sys


def main() -> int:
    try:
        from controller.cli import main as atoll
    except KeyboardInterrupt:
        print("atoll: stopped (Ctrl-C) while it started; nothing was done", file=sys.stderr)
        return 130
    return atoll()
