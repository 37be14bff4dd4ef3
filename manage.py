#!/usr/bin/env python
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "prbench.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
    # A model command that succeeded asked to end here (core.fast_exit.ModelCommand): its output
    # is written and its database connections are closed; after torch, the interpreter's teardown
    # would be 0.5-1.5 s more to wait. Any other command returns from this call and exits as usual.
    from core.fast_exit import exit_skipping_teardown

    exit_skipping_teardown()


if __name__ == "__main__":
    main()
