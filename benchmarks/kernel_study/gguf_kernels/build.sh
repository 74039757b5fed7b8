#!/bin/sh
g++ -O3 -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx512vbmi -mavx2 -mavx512dq -mf16c -mfma -ffp-contract=off -fopenmp -shared -fPIC -o libq4k.so q4k_kernel.cpp
g++ -O3 -mavx512f -fopenmp -shared -fPIC -o libbw.so bw.cpp
g++ -O3 -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx512vbmi -mavx2 -mavx512dq -mf16c -mfma -ffp-contract=off -fopenmp -shared -fPIC -o libq6k.so q6k_kernel.cpp
