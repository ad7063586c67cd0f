"""`python -m harness.tune ...`: the tuning command without the rest of the `qwen36` CLI's imports."""
import argparse
import sys

from harness.tune.args import add_arguments, run_command


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.tune", description=__doc__)
    add_arguments(p)
    argv = sys.argv[1:] if argv is None else argv
    a = p.parse_args(argv)
    a.invocation = ["python", "-m", "harness.tune", *argv]
    return run_command(a)  # imports torch only now: --help answers without it


if __name__ == "__main__":
    sys.exit(main())
