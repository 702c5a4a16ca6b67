#!/bin/sh
# powertune: bert-base on h200, study bert-base|h200|offline|20ms trial 10
# cannot express: builds the engine only: no clock, power mode or batching timeout; input names are placeholders
# rename 'input' to the ONNX model's input; the batch ladder is 1, 2, 4, 8, 16, 32, 64, 128
set -e
trtexec --onnx=bert-base.onnx --saveEngine=bert-base-b128-bf16.plan --bf16 --minShapes=input:1x128 --optShapes=input:128x128 --maxShapes=input:128x128
