"""Test-model generators: tiny synthetic GGUFs (pairs, EAGLE-3 heads, MTP, recurrent and hybrid
targets) for the test suite and `localspec bench --synthetic`. Not part of the runtime: nothing
outside tests and benchmarks imports them."""
