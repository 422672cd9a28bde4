// pretrain_gpt: Megatron-LM's pretrain_gpt.py in C++. Takes Megatron's flags (see
// `pretrain_gpt --help`, megatron/training/arguments.h) or a --yaml-cfg of them, builds a GPT
// model, the optimizer and the datasets, and trains with checkpoints and Megatron-format log lines
// (megatron/training/training.h). Errors print one line and exit 1 (under mpirun: every rank ends).
//
//   build/bin/pretrain_gpt --num-layers 2 --hidden-size 128 --num-attention-heads 4
//     --seq-length 128 --micro-batch-size 4 --global-batch-size 8 --train-iters 100 --lr 1e-3
//     --mock-data --tokenizer-type NullTokenizer --vocab-size 1000 --log-interval 10
#include <cstdio>
#include <exception>
#include <iostream>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/common/error.h"
#include "megatron/training/arguments.h"
#include "megatron/training/training.h"

int main(int argc, char** argv) {
  try {
    const mg::training::Arguments args = mg::training::parse_args(argc, argv);
    if (args.help) {
      std::cout << "usage: pretrain_gpt [--flag value ...]  (Megatron-LM's flags)\n\n"
                << args.help_text;
      return 0;
    }
    mg::training::pretrain(args);
  } catch (const std::exception& e) {
    // One line on stderr, exit 1; under mpirun the message names the rank and MPI_Abort ends
    // every rank (never a hang).
    mg::comm::abort_on_error(e, "pretrain_gpt");
  }
  return 0;
}
