# Dataset inference (readers, batched runs, --resume), docs/models.md, the installed package.
xfuser_add_test(test_dataset.cpp)
xfuser_add_test(test_dataset_run.cpp LABELS mpi TIMEOUT 900)
xfuser_add_test(test_dataset_resume.cpp TIMEOUT 600)
xfuser_add_test(test_models_doc.cpp)
xfuser_add_test(test_install.cpp TIMEOUT 600)
# The libc10 the build linked: the installed tool must load that one, not another on the system.
target_compile_definitions(test_install PRIVATE XFUSER_TEST_C10_LIBRARY="${c10_LIBRARY}")
