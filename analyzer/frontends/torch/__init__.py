"""The PyTorch frontends.

Importing them quiets two dependencies' import-time logs that are not about the user's model
(where the caller has not set those loggers' levels), so that a graphcost call prints nothing:
torchao — which transformers imports wherever it is installed, on the way to any model —
logs, at warning level, each CUDA extension a CPU cannot load, and torch logs torchao's
registering of its enums as deprecated."""
import logging

QUIET_LOGGERS = ("torchao", "torch.utils._pytree")
for _name in QUIET_LOGGERS:
    if logging.getLogger(_name).level == logging.NOTSET:
        logging.getLogger(_name).setLevel(logging.ERROR)
