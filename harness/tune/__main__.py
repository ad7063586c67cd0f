"""`python -m harness.tune ...`: the tuning command without the rest of the `qwen36` CLI's imports."""
import argparse
import sys

from harness.tune.args import add_arguments


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.tune", description=__doc__)
    add_arguments(p)
    argv = sys.argv[1:] if argv is None else argv
    a = p.parse_args(argv)
    a.command = ["python", "-m", "harness.tune", *argv]
    from harness.tune.cli import run  # after parsing: --help answers without loading torch

    return run(a)


if __name__ == "__main__":
    sys.exit(main())
