"""torchvision's ResNet-18, ResNet-50 and MobileNetV2 written out, for hosts where torchvision cannot be imported
(the build host's CPU torch has no matching torchvision wheel). Parameter names and shapes are
torchvision's, so its checkpoints load with ``load_state_dict`` and a seeded random initialisation gives
the same network on every host.

    net = make_net("resnet50", seed=0)          # eval mode, random weights
    export_onnx(net, Path("resnet50.onnx"))     # input "image" N x 3 x 224 x 224, output "logits"
"""

from __future__ import annotations

from pathlib import Path


def _modules():
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample=None):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            return self.relu(self.bn3(self.conv3(out)) + identity)

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample=None):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = downsample

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(out)) + identity)

    class ResNet(nn.Module):
        def __init__(self, layers=(3, 4, 6, 3), num_classes: int = 1000, block=Bottleneck):
            super().__init__()
            self.inplanes, self.block = 64, block
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            self.layer1 = self._layer(64, layers[0])
            self.layer2 = self._layer(128, layers[1], 2)
            self.layer3 = self._layer(256, layers[2], 2)
            self.layer4 = self._layer(512, layers[3], 2)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512 * block.expansion, num_classes)
            for m in self.modules():  # torchvision's initialisation
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

        def _layer(self, planes: int, blocks: int, stride: int = 1):
            downsample, width = None, planes * self.block.expansion
            if stride != 1 or self.inplanes != width:
                downsample = nn.Sequential(
                    nn.Conv2d(self.inplanes, width, 1, stride, bias=False), nn.BatchNorm2d(width)
                )
            layers = [self.block(self.inplanes, planes, stride, downsample)]
            self.inplanes = width
            layers += [self.block(self.inplanes, planes) for _ in range(1, blocks)]
            return nn.Sequential(*layers)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    def conv_bn(cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1):
        return nn.Sequential(
            nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(inplace=True),
        )

    class InvertedResidual(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, expand: int):
            super().__init__()
            hidden = cin * expand
            self.use_res_connect = stride == 1 and cin == cout
            layers = [conv_bn(cin, hidden, 1)] if expand != 1 else []
            layers += [
                conv_bn(hidden, hidden, 3, stride, groups=hidden),
                nn.Conv2d(hidden, cout, 1, bias=False),
                nn.BatchNorm2d(cout),
            ]
            self.conv = nn.Sequential(*layers)

        def forward(self, x):
            return x + self.conv(x) if self.use_res_connect else self.conv(x)

    class MobileNetV2(nn.Module):
        def __init__(self, num_classes: int = 1000):
            super().__init__()
            setting = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2)]
            setting.append((6, 320, 1, 1))
            features, cin = [conv_bn(3, 32, stride=2)], 32
            for t, c, n, s in setting:
                for i in range(n):
                    features.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                    cin = c
            features.append(conv_bn(cin, 1280, 1))
            self.features = nn.Sequential(*features)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))
            for m in self.modules():  # torchvision's initialisation
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out")
                elif isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, 0, 0.01)
                    nn.init.zeros_(m.bias)

        def forward(self, x):
            x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
            return self.classifier(torch.flatten(x, 1))

    return {
        "resnet18": lambda: ResNet((2, 2, 2, 2), block=BasicBlock),
        "resnet50": ResNet,
        "mobilenet_v2": MobileNetV2,
    }


NETS = ("resnet18", "resnet50", "mobilenet_v2")


def make_net(name: str, seed: int = 0):
    """The architecture ``name`` (one of :data:`NETS`) with seeded random weights, in eval mode."""
    import torch

    classes = _modules()
    if name not in classes:
        raise SystemExit(f"unknown network {name!r}; valid: {', '.join(NETS)}")
    torch.manual_seed(seed)
    return classes[name]().eval()


def export_onnx(net, path: Path, dynamic_batch: bool = True) -> Path:
    import torch

    torch.onnx.export(
        net,
        (torch.zeros(1, 3, 224, 224),),
        str(path),
        dynamo=False,
        opset_version=17,
        input_names=["image"],
        output_names=["logits"],
        dynamic_axes={"image": {0: "N"}, "logits": {0: "N"}} if dynamic_batch else None,
    )
    return path
