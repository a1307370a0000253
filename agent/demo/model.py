"""The demo's model: a two-layer MLP built in code with `onnx.helper`, so no binary is committed.

    x[batch, features] → MatMul W1 → Add b1 → Relu → embedding[batch, hidden]
                       → MatMul W2 → Add b2 → scores[batch, classes]

Two outputs, like a ranking server that returns scores and the embedding it computed: the `leak`
behaviour caches the embeddings, so what it leaks is real onnxruntime output memory. Weights are
seeded, so every server of a fleet answers the same. At the defaults the file is about 1.3 MiB
and each row of a batch yields a 16 KiB embedding.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.core.errors import MedicError

INSTALL_HINT = "pip install onnxruntime onnx (in medic's checkout: pip install -e '.[demo]', or make demo)"
OPSET = 17
IR_VERSION = 8  # what onnxruntime 1.16+ reads; newer onnx packages default to a higher one


@dataclass(frozen=True, slots=True)
class ModelShape:
    features: int = 64
    hidden: int = 4096
    classes: int = 16

    def __post_init__(self) -> None:
        for name in ("features", "hidden", "classes"):
            value = getattr(self, name)
            if not 1 <= value <= 8192:
                raise ValueError(f"model {name} must be between 1 and 8192, got {value}")

    def embedding_bytes(self, batch: int) -> int:
        """Bytes of one request's embedding output (float32): what a `leak` server keeps per request."""
        return batch * self.hidden * 4


def require_runtime() -> None:
    """Raise a MedicError that says what to install when onnxruntime or onnx is missing."""
    missing = []
    for module in ("onnxruntime", "onnx"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise MedicError(f"medic demo needs {' and '.join(missing)}, which is not installed: {INSTALL_HINT}")


def build_model(path: Path, shape: ModelShape = ModelShape(), seed: int = 7) -> Path:
    """Write the model to `path` (checked by `onnx.checker`) and return the path."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((shape.features, shape.hidden)) / np.sqrt(shape.features)).astype(np.float32)
    b1 = np.zeros(shape.hidden, dtype=np.float32)
    w2 = (rng.standard_normal((shape.hidden, shape.classes)) / np.sqrt(shape.hidden)).astype(np.float32)
    b2 = np.zeros(shape.classes, dtype=np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["h_b"]),
        helper.make_node("Relu", ["h_b"], ["embedding"]),
        helper.make_node("MatMul", ["embedding", "W2"], ["s"]),
        helper.make_node("Add", ["s", "b2"], ["scores"]),
    ]
    graph = helper.make_graph(
        nodes,
        "medic_demo_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", shape.features])],
        [
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", shape.classes]),
            helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", shape.hidden]),
        ],
        initializer=[
            numpy_helper.from_array(w1, "W1"),
            numpy_helper.from_array(b1, "b1"),
            numpy_helper.from_array(w2, "W2"),
            numpy_helper.from_array(b2, "b2"),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="sidecar-medic demo"
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    onnx.save(model, str(tmp))
    tmp.replace(path)  # atomic: a server never reads half a model
    return path
