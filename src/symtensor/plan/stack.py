"""The facts of the user's software stack (``cost.stack``, where the training configuration holds them), under the
name the library's users import them by."""

from symtensor.cost.stack import DEFAULTS, KEYS, Stack, refusal

__all__ = ["DEFAULTS", "KEYS", "Stack", "refusal"]
