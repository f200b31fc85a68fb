# `xfuser serve`: the request parser, queue and metrics; the service started over HTTP at 1 and
# 2 ranks against xfuser-run's pictures and videos, its refusals, drain and failures.
xfuser_add_test(test_serve.cpp TIMEOUT 900)
target_link_libraries(test_serve PRIVATE PkgConfig::HTTPLIB)
