# Dataset inference (readers, batched runs, --resume), docs/models.md, the installed package.
xfuser_add_test(test_models_doc.cpp)
