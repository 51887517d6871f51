def calculator(expression: str) -> str:
    """Evaluate a sum of integers, like "2+3"."""
    return str(sum(int(part) for part in expression.split("+")))
