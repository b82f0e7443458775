"""platonic_jax: Platonic Task Arithmetic in JAX / Flax NNX.

Universal Task Descriptors record a task's functional effect on a dual encoder as a
probes x classes affinity-change matrix; they are written into any target model by one ridge
solve folded into its last layer, or by a LoRA adapter, and compose by addition and negation.
"""

from platonic_jax.api import *  # noqa: F401,F403
from platonic_jax.api import __all__  # noqa: F401

__version__ = "0.1.0"
