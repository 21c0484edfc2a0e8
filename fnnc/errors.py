"""The one error hierarchy of fnnc.

Every error fnnc raises for a user mistake derives from :class:`FnncError` and from
the matching builtin, so ``except ValueError`` keeps working for callers that do not
know fnnc. A message says what was expected, what came, where (node, tensor, file),
and what to do.
"""

from __future__ import annotations


class FnncError(Exception):
    """Base class of every error fnnc raises on purpose."""


class ConfigError(FnncError, ValueError):
    """A configuration value (environment variable or override) fnnc does not know."""


class ShapeError(FnncError, ValueError):
    """A tensor's shape does not fit what a command or graph expects."""


class DTypeError(FnncError, TypeError):
    """A tensor's dtype does not fit what a command or graph expects."""


class UnknownCommandError(FnncError, KeyError):
    """A command name that is not in the registry."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class CommandError(FnncError, ValueError):
    """A command was given bad hyper-parameters or the wrong number of inputs."""


class RuleError(CommandError, TypeError):
    """A command's shape rule could not take its hyper-parameters (a right kind holding
    wrong contents, e.g. ``reduce_sum(axes=("a",))``): raised instead of the rule's raw
    ``TypeError``/``IndexError``, naming the command, its parameters and the inputs."""


class GraphError(FnncError, ValueError):
    """A graph breaks a structural rule (SSA, def-before-use, unknown symbol)."""


class GraphInputError(FnncError, ValueError):
    """A graph or program was fed the wrong number of arrays, a pytree of another
    structure, or a ``donate`` / ``shardings`` that does not fit its inputs, or an array a
    donating call took (deleted), or one array passed in a donated and another position.
    One input of the wrong shape or dtype is a :class:`ShapeError` or
    :class:`DTypeError` naming it."""


class GraphFormatError(FnncError, ValueError):
    """A file or value that was to be loaded as a graph is not one."""


class BackendError(FnncError, ValueError):
    """A forced backend does not support the input it was given."""


class TraceError(FnncError, ValueError):
    """A JAX function could not be traced into a graph."""


class TensorFileError(FnncError, ValueError):
    """A tensor file, or one row in it, is not in NNC's format (or cannot be opened)."""


class TensorNotFoundError(FnncError, KeyError):
    """A tensor name that is not in the file."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ParameterError(FnncError, ValueError):
    """Stored model parameters do not match what the model expects (missing, mis-shaped)."""


class CheckpointError(FnncError, ValueError):
    """A checkpoint cannot be saved or restored (unknown step, unsupported state)."""


class ModelError(FnncError, ValueError):
    """A cnnp model was defined or used wrongly (names the layer or parameter)."""


class NumericsError(FnncError, FloatingPointError):
    """A NaN or infinity appeared (the numerics check names the first node that made it)."""


class DataError(FnncError, ValueError):
    """A dataframe was described or fed wrongly: an unknown column, a map function that
    raised (naming the column and the row), rows whose shapes change inside a batch, an
    iterator state from another dataframe.

    >>> from fnnc.data import DataError
    >>> issubclass(DataError, ValueError)
    True
    """


def located(error: FnncError, where: str) -> FnncError:
    """``error`` with `` (where)`` after its message, as the same kind of error (so
    ``except UnknownCommandError`` still catches it): how a loader names the file an
    error came from.

    >>> located(GraphError("verify: output %9 is never written"), "file g.json")
    GraphError('verify: output %9 is never written (file g.json)')
    """
    message = f"{error} ({where})"
    try:
        return type(error)(message)
    except TypeError:  # a subclass with its own constructor: the base kind, still an FnncError
        return GraphFormatError(message)
