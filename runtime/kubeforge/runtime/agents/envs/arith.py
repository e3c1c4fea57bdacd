"""A safe arithmetic evaluator for the Calculator tool: integers, + - * / // % **, parentheses; no ``eval``.

The expression is parsed with ``ast`` and walked over an allow-list of node types; anything else (names, calls,
attributes, strings) is refused. Bounds keep one call cheap: the expression's length, the exponent, and the size
of every intermediate result.
"""
from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from fractions import Fraction

MAX_CHARS = 200
MAX_EXPONENT = 64
MAX_DIGITS = 60

_BINARY: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: lambda a, b: Fraction(a // b), ast.Mod: operator.mod,
}


class ArithmeticError_(ValueError):
    """The expression is not allowed arithmetic, or it fails (division by zero, too large)."""


def evaluate(expression: str) -> Fraction:
    if len(expression) > MAX_CHARS:
        raise ArithmeticError_(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ArithmeticError_("not an arithmetic expression") from None
    return _walk(tree.body)


def _walk(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return _bounded(Fraction(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _walk(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a, b = _walk(node.left), _walk(node.right)
        if isinstance(node.op, ast.Pow):
            if b.denominator != 1 or abs(b) > MAX_EXPONENT:
                raise ArithmeticError_(f"exponent must be an integer of at most {MAX_EXPONENT}")
            if a == 0 and b < 0:
                raise ArithmeticError_("division by zero")
            return _bounded(a ** int(b))
        fn = _BINARY.get(type(node.op))
        if fn is None:
            raise ArithmeticError_(f"operator {type(node.op).__name__} not allowed")
        if b == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            raise ArithmeticError_("division by zero")
        return _bounded(fn(a, b))
    raise ArithmeticError_(f"{type(node).__name__} not allowed: numbers and + - * / // % ** ( ) only")


def _bounded(v: Fraction) -> Fraction:
    if len(str(v.numerator)) > MAX_DIGITS or len(str(v.denominator)) > MAX_DIGITS:
        raise ArithmeticError_(f"a number of more than {MAX_DIGITS} digits")
    return v


def show(v: Fraction) -> str:
    """An integer as itself, else a decimal with up to 6 places."""
    if v.denominator == 1:
        return str(v.numerator)
    return f"{float(v):.6f}".rstrip("0").rstrip(".")
