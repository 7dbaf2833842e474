"""Model import: ONNX files and torch.export programs (``.pt2``) to a Relax module with detached weights."""

from inferx_edge.frontend.model import ImportedModel, import_model
from inferx_edge.frontend.shapes import parse_input_shapes

__all__ = ["ImportedModel", "import_model", "parse_input_shapes"]
