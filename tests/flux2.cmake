# FLUX.2: the Flux2Transformer2DModel (diffusers 0.36.0 fixtures, parts and block ranges, tensor
# parallel slices, config / weight / input errors).
xfuser_add_test(test_flux2_transformer.cpp LABELS unit fixture)
# Under the generic drivers (NP 2): tensor parallel 2, Ulysses 2 and ring 2 (text split or
# replicated, odd token counts) and PipeFusion over 2 stages against one rank.
xfuser_add_test(test_flux2_parallel.cpp NP 2 TIMEOUT 300 LABELS fixture mpi)
# `xfuser forward` on both fixtures, and under mpirun (spawns its own 2-rank jobs): tensor
# parallel 2, Ulysses 2 and ring 2 equal the tiny fixture.
xfuser_add_test(test_flux2_run.cpp TIMEOUT 300 LABELS fixture mpi)
