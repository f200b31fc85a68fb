# Reliability (issue [F]): bad inputs named, faults ending the whole job.
xfuser_add_test(test_bad_inputs.cpp TIMEOUT 900)
xfuser_add_test(test_faults.cpp LABELS faults slow TIMEOUT 900)
