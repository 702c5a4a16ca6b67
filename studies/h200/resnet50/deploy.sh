#!/bin/sh
# powertune: resnet50 on h200, study resnet50|h200|offline|20ms trial 12
# cannot express: builds the engine only: no clock, power mode or batching timeout; input names are placeholders
# rename 'input' to the ONNX model's input; the batch ladder is 1, 2, 4, 8, 16, 32, 64, 128
set -e
trtexec --onnx=resnet50.onnx --saveEngine=resnet50-b128-fp16.plan --fp16 --minShapes=input:1x3x224x224 --optShapes=input:128x3x224x224 --maxShapes=input:128x3x224x224
