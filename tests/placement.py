"""Part of a model on another device, as ``--device-map auto`` leaves it over several GPUs, simulated on a CPU.

accelerate's ``dispatch_model`` gives each placed module a hook that moves the module's inputs to its own device
and leaves its outputs there; only the top-level model moves its outputs back to the input device. rm-probe's
engine calls the backbone, so hidden states come out on the device of the last layers. Here the "other GPU" is
the ``meta`` device: a tensor computed there has a shape but no values, and most operations that mix it with a
CPU tensor raise, as they would with two GPUs. A test passes when every operation of a path keeps to one
device; the values are checked on one device by the parity tests.
"""

from __future__ import annotations

import torch


def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(_to(v, device) for v in x)
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    return x


def place(module: torch.nn.Module, device: str = "meta") -> torch.nn.Module:
    """``module``'s weights on ``device``, with a hook that moves its inputs there (accelerate's AlignDevicesHook
    with io_same_device=False)."""
    module.to(device)

    def hook(mod, args, kwargs):
        return _to(args, device), _to(kwargs, device)

    module.register_forward_pre_hook(hook, with_kwargs=True)
    return module


def split_model(model: torch.nn.Module) -> torch.nn.Module:
    """The second half of the decoder layers, the final norm and every head module on ``meta``; the embeddings and
    the first half stay where they are (a copy is made). A tied LM head cannot stay with the embeddings here:
    nothing comes back from ``meta``."""
    import copy

    model = copy.deepcopy(model)
    backbone = getattr(model, model.base_model_prefix)
    layers = backbone.layers
    for layer in layers[len(layers) // 2:]:
        place(layer)
    place(backbone.norm)
    for name in ("score", "lm_head", "regression_layer", "gating", "v_head", "regression_head", "score_head",
                 "gating_layer"):
        if isinstance(getattr(model, name, None), torch.nn.Module):
            place(getattr(model, name))
    if getattr(model, "reward_transform_matrix", None) is not None:
        model.reward_transform_matrix = torch.nn.Parameter(model.reward_transform_matrix.to("meta"),
                                                           requires_grad=False)
    return model


class StrictDevices(torch.overrides.TorchFunctionMode):
    """Raises on any torch call whose tensor arguments sit on two devices (a 0-dim CPU tensor, which CUDA kernels
    accept as a scalar, excepted; moves and copies between devices are what they are for). Stricter than the
    meta device alone, which accepts CPU index tensors where a GPU would refuse indices from another GPU."""

    MOVES = {"to", "copy_", "cpu", "cuda", "type", "__get__", "__set__", "__repr__", "__format__", "numpy", "tolist",
             "item", "__len__", "__bool__", "__iter__", "dim", "size", "shape", "device", "dtype"}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name not in self.MOVES:
            devices = set()
            for x in torch.utils._pytree.tree_flatten((args, kwargs))[0]:
                if isinstance(x, torch.Tensor) and not (x.device.type == "cpu" and x.dim() == 0):
                    devices.add(x.device)
            if len(devices) > 1:
                raise RuntimeError(f"{name}: tensors on {sorted(map(str, devices))} in one operation")
        return func(*args, **kwargs)
