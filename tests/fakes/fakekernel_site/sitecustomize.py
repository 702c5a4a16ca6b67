"""Child processes of the Jetson tests obey the fake kernel's rules (see tests/fakes/fakekernel.py).

With FAKE_MEASURE=hang a child's Jetson window never ends, so a test can kill it mid-trial after
the board was changed, without paying for a model and LoadGen in every child. With
FAKE_TENSORRT=N a child imports tests/fakes/fake_tensorrt.py as ``tensorrt``, on a platform with N DLA cores.
With FAKE_GPU_CONTEXT=window a child's Jetson window creates the GPU context on its fake board, as a real
model run does (nvpmodel's golden-context rule, tests/fakes/fakeboard.py).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fakekernel

fakekernel.register_from_environment()

if os.environ.get("FAKE_MEASURE") == "hang":
    import time

    from tuner.devices.jetson.device import JetsonDevice

    def _hang(self, model, config, settings):
        time.sleep(600)

    JetsonDevice.measure = _hang

if os.environ.get("FAKE_TENSORRT", "").isdigit():
    import fake_tensorrt

    sys.modules["tensorrt"] = fake_tensorrt.module()
    fake_tensorrt.Builder.num_DLA_cores = int(os.environ["FAKE_TENSORRT"])

if os.environ.get("FAKE_GPU_CONTEXT") == "window":
    import fakeboard

    from tuner.devices.jetson.device import JetsonDevice

    JetsonDevice.measure = fakeboard.windows_create_context(JetsonDevice.measure)
