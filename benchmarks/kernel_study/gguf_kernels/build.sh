#!/bin/sh
# The kernels themselves live in src/specdec/native (python -m specdec.native.build); this builds the read-bandwidth probe.
g++ -O3 -mavx512f -fopenmp -shared -fPIC -o libbw.so bw.cpp
