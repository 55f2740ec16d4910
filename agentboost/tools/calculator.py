"""A safe arithmetic calculator tool: parses the expression with ``ast`` and evaluates a small,
explicit grammar (numbers, + - * / // % **, unary minus, parentheses). Never ``eval``."""

from __future__ import annotations

import ast
import math
import operator
from fractions import Fraction

from strands import tool

MAX_EXPRESSION_CHARS = 256
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**30
MAX_NODES = 128

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


class CalculatorError(ValueError):
    pass


def evaluate(expression: str) -> Fraction:
    """Evaluate an arithmetic expression exactly (rational arithmetic)."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalculatorError("empty expression")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"syntax error: {exc.msg}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalculatorError("expression too complex")
    return _eval(tree.body)


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, float) and not math.isfinite(node.value):  # 1e999
            raise CalculatorError("number too large")
        value = Fraction(node.value)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _eval(node.operand)
        value = -inner if isinstance(node.op, ast.USub) else inner
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1 or abs(right) > MAX_EXPONENT:
                raise CalculatorError(f"exponents must be integers with |e| <= {MAX_EXPONENT}")
            if left == 0 and right < 0:
                raise CalculatorError("division by zero")
            value = left ** int(right)
        elif isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and right == 0:
            raise CalculatorError("division by zero")
        else:
            value = _BINARY[type(node.op)](left, right)
            value = Fraction(value)
    else:
        raise CalculatorError(f"unsupported syntax: {type(node).__name__}")
    if abs(value) > MAX_MAGNITUDE:
        raise CalculatorError("number too large")
    return value


def format_number(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    as_float = float(value)  # 12 significant digits: small results stay visible ((1/3)**64 -> 2.92e-31)
    return f"{as_float:.12g}" if math.isfinite(as_float) and as_float != 0 else str(value)


@tool
def calculator(expression: str) -> dict:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: the expression, e.g. "(12 + 7) * 3"; numbers and + - * / // % ** ( ) only.
    """
    try:
        return {"status": "success", "content": [{"text": format_number(evaluate(expression))}]}
    except CalculatorError as exc:
        return {"status": "error", "content": [{"text": f"Error: {exc}"}]}
