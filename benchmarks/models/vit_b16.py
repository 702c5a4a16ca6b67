"""A user's own model as `tune run --model py:vit_b16:build` takes it: torchvision's ViT-B/16, random weights.

For the H200 time-to-answer benchmark (benchmarks/time_to_answer_h200.py, case vit-offline): the weights do not
change the work a window measures, and the device machine cannot download trained ones.
"""


def build():
    from torchvision.models import vit_b_16

    return vit_b_16(weights=None).eval(), (3, 224, 224)
