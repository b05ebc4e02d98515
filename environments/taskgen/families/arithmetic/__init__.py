"""The arithmetic family (see detect.py): any tool that evaluates expressions or computes with
numbers, recognised by what it answers."""

from environments.taskgen.families.arithmetic.detect import ArithmeticFamily


def family(server: str) -> ArithmeticFamily:
    return ArithmeticFamily(server)
