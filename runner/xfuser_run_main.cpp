// `xfuser-run`: the runner. PLACEHOLDER until the pipeline lands.
#include <iostream>

int main(int argc, char** argv) {
  std::cerr << "xfuser-run: the generation pipeline is not built yet" << std::endl;
  return 1;
}
