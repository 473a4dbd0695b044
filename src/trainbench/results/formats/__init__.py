"""The log formats trainbench reads, one module each; importing this package registers
them in parse.REGISTRY (parse.load_formats does, on first use).

The order of the imports is the registry's: formats are tried, and named in messages, in
this order (NeMo first, the seeds' own format)."""

# isort: off
from . import nemo  # noqa: F401 - registers NeMo 2, NeMo 1
from . import megatron  # noqa: F401 - registers Megatron-LM/Bridge, Megatron-DeepSpeed
from . import maxtext  # noqa: F401 - registers MaxText
from . import torchtitan  # noqa: F401 - registers torchtitan
# isort: on
