"""Platform names as fnnc spells them: ``"cpu"``, ``"gpu"`` and ``"tpu"``.

Backends declare, and autotune tables key on, these names; users and JAX also say
``"cuda"`` / ``"rocm"`` (JAX's platforms of NVIDIA and AMD GPUs, as
:func:`jax.export.export` takes them) and capitals. :func:`platform_name` maps each to
fnnc's, so ``compile(platform="cuda")`` picks the GPU kernels ``platform="gpu"`` picks,
and a misspelt name is an error rather than a program of references alone.

>>> platform_name("CUDA", "compile")
'gpu'
"""

from __future__ import annotations

import jax

from fnnc import config
from fnnc.errors import ConfigError

PLATFORMS = ("cpu", "gpu", "tpu")
"""The platform names backends declare and table keys hold (JAX's ``cuda`` and ``rocm``
are ``gpu``); the reference backend runs on each."""

_ALIASES = {"cuda": "gpu", "rocm": "gpu"}


def platform_name(platform: str | None, where: str) -> str:
    """fnnc's name of ``platform`` (lowercased; ``cuda`` and ``rocm`` are ``gpu``), or of
    JAX's default backend where it is ``None``.

    Args:
        platform: a name the user gave, or ``None``.
        where: the function that was given it, for the error message.

    Raises:
        ConfigError: ``platform`` is none of :data:`PLATFORMS` or their aliases.
    """
    if platform is None:  # a plugin's own platform (jax-metal) is kept as JAX names it
        here = jax.default_backend().lower()
        return _ALIASES.get(here, here)
    name = platform.lower() if isinstance(platform, str) else platform
    name = _ALIASES.get(name, name)
    if name not in PLATFORMS:
        hint = config.close_matches(str(name), [*PLATFORMS, *_ALIASES])
        raise ConfigError(
            f"{where}: unknown platform {platform!r}; expected one of {list(PLATFORMS)} "
            f"(or 'cuda' / 'rocm', both 'gpu').{hint} Leave it out for JAX's default "
            f"backend ({jax.default_backend()!r} here)."
        )
    return name
