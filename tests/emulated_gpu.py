"""A GPU emulated on the CPU, so that a machine without one tests what `runtime.torch_device=cuda`
does with tensors: which of them a run puts on the accelerator, and whether it then mixes them
with CPU tensors or reads them as numpy arrays, as CUDA would refuse.

Inside `emulated_gpu()`, `runtime.torch_device=cuda` names torch's spare backend
(PrivateUse1, set up as a Python backend named `emugpu`). Its tensors (`OnDevice`) wrap CPU tensors: the
math runs on the CPU, bit for bit as there, and `EmulatedGpu`, a dispatch mode, checks each
operation first:

- tensors on the emulated device and on the CPU in one operation raise `DeviceMix`, as CUDA
  raises "Expected all tensors to be on the same device" (a zero-dimensional CPU tensor is a
  scalar, which CUDA takes; copies, and a CPU index into a device tensor, cross as on CUDA);
- `.numpy()` of a device tensor raises, as CUDA's does;
- factories given the device make device tensors, `.to(device)` and `.cpu()` move.

What it does not emulate: CUDA's own calls (streams, pinned memory, TF32, `torch.cuda.*`), so a
run takes its generic accelerator paths (`device.type != "cpu"`), not the ones for `cuda`;
the defaults that are on for CUDA (`runtime.batch_replicas`, `runtime.replica_conv=matmul`)
must be set. A parameter on the device is an `OnDevice` flagged as a parameter, as torch makes a
Parameter of a tensor subclass, not an `nn.Parameter`: code that asks `type(p) is nn.Parameter`
(model copies in blocks, framework/models.py) takes its other path. The real GPU tests
(tests/test_replica_batching.py, tests/test_models.py) stay the check of CUDA itself.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

NAME = "emugpu"  # torch.device("emugpu")
_READY = False


def wanted() -> bool:
    """Whether to emulate here: not where CUDA is (the real GPU tests run there, and torch would
    take the emulated backend for the machine's accelerator)."""
    return not torch.cuda.is_available()


def device() -> torch.device:
    """The emulated accelerator (torch's PrivateUse1 backend, set up once per process, and before
    the process's first backward: autograd's engine counts each backend's devices once, and a
    backward on a device it did not count fails an internal assertion; tests/conftest.py calls
    this at import)."""
    global _READY
    if not _READY:
        if torch._C._get_privateuse1_backend_name() != NAME:
            from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

            # renamed: under its default name the autograd engine finds no accelerator for it
            _setup_privateuseone_for_python_backend(NAME)
        _READY = True
    return torch.device(NAME, 0)


class DeviceMix(RuntimeError):
    """An operation took tensors on the emulated device and on the CPU."""


class OnDevice(torch.Tensor):
    """A tensor on the emulated device: a CPU tensor (`elem`) that says it is elsewhere."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        r = torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(),
                                                dtype=elem.dtype, device=device(), layout=elem.layout, requires_grad=elem.requires_grad)
        r.elem = elem
        return r

    def __repr__(self, *, tensor_contents=None):
        return f"OnDevice({self.elem!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})

    def data_ptr(self) -> int:  # where the bytes are: the replica bank and the checkpoint compare them
        return self.elem.data_ptr()

    def __deepcopy__(self, memo):  # torch's copies the storage, which a wrapper has none of
        got = memo.get(id(self))
        if got is None:
            with torch.no_grad():
                got = OnDevice(self.elem.clone(memory_format=torch.preserve_format))
            if getattr(self, "_is_param", False):
                got = torch.nn.Parameter(got, self.requires_grad)
            elif self.requires_grad:
                got.requires_grad_(True)
            memo[id(self)] = got
        return got

    def tolist(self):  # a read back to the host, as CUDA's (torch refuses it for subclasses)
        return self.elem.tolist()

    def numpy(self, *, force: bool = False):
        raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first.")

    # `param.data = t` points a parameter at another tensor's memory (the replica bank's rows,
    # block copies); torch copies the wrapper's metadata, and the wrapped tensor must follow
    @property
    def data(self):
        return torch._C.TensorBase.data.__get__(self)

    @data.setter
    def data(self, new):
        torch._C.TensorBase.data.__set__(self, new)
        self.elem = new.elem if isinstance(new, OnDevice) else new


# operations that may take both: copies across devices, and CPU indices into a device tensor. Any
# other mix is refused, which may be stricter than CUDA for some operation: if a real CUDA run
# takes one that this refuses, add it here with the reason
_CROSSING = {
    torch.ops.aten.copy_.default,
    torch.ops.aten._to_copy.default,
    torch.ops.aten._foreach_copy_.default,
    torch.ops.aten.index.Tensor,
    torch.ops.aten.index_put_.default,
    torch.ops.aten.index_put.default,
    torch.ops.aten._index_put_impl_.default,
}


def _where(t: torch.Tensor) -> str | None:
    if isinstance(t, OnDevice):
        return "device"
    if t.device.type == "meta" or t.dim() == 0:  # shapes only; a CPU scalar goes anywhere
        return None
    return t.device.type


def _run(func, args, kwargs):
    flat, _ = tree_flatten((args, kwargs))
    tensors = [t for t in flat if isinstance(t, torch.Tensor)]
    places = {p for p in map(_where, tensors) if p is not None}
    if len(places) > 1 and func not in _CROSSING:
        raise DeviceMix(f"{func} takes tensors on the emulated GPU and on the CPU (CUDA raises: expected all tensors to be on the same device)")
    on_device = any(isinstance(t, OnDevice) for t in tensors)
    if "device" in kwargs and kwargs["device"] is not None:
        target = torch.device(kwargs["device"])
        on_device = target.type == device().type
        if on_device:
            kwargs = {**kwargs, "device": torch.device("cpu")}
    if kwargs.get("pin_memory"):
        kwargs = {**kwargs, "pin_memory": False}
    unwrapped = {id(t.elem): t for t in tensors if isinstance(t, OnDevice)}

    def inner(x):
        return x.elem if isinstance(x, OnDevice) else x

    out = func(*tree_map(inner, args), **tree_map(inner, kwargs))
    if func in (torch.ops.aten.copy_.default, torch.ops.aten._foreach_copy_.default):
        return args[0] if func is torch.ops.aten.copy_.default else None

    def outer(x):
        if not isinstance(x, torch.Tensor):
            return x
        same = unwrapped.get(id(x))
        if same is not None:  # an in-place operation returns its input
            return same
        return OnDevice(x) if on_device and x.device.type == "cpu" else x

    return tree_map(outer, out)


class EmulatedGpu(TorchDispatchMode):
    """Runs every operation through the device checks (factories included, which no tensor
    argument would route to `OnDevice`)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


@contextlib.contextmanager
def emulated_gpu():
    """`runtime.torch_device=cuda` on the emulated device, for the block."""
    from framework import torch_device

    dev = device()
    named = torch_device.named

    def emulated(name: str) -> torch.device:
        return dev if name.startswith("cuda") else named(name)

    torch_device.named = emulated
    try:
        with EmulatedGpu():
            yield dev
    finally:
        torch_device.named = named
