#pragma once
// Tensor-parallel collectives on GPUs: NCCL on the cuda backend's stream, bootstrapped over
// MPI (one process per GPU under mpirun). Built when CUDA, NCCL and MPI are all available
// (ACTBENCH_HAVE_NCCL_COMM); otherwise make_nccl_communicator throws InvalidArgument.
//
// How a runner uses it (the order matters):
//   auto mpi = make_mpi_communicator();                  // MPI_Init, world size and rank
//   select_cuda_device_for_rank(mpi->rank());            // before the backend exists
//   auto be = make_backend("cuda", limit);               // its stream is on that device
//   auto comm = make_nccl_communicator(cuda_stream_of(*be));
//   ... run; destroy comm and be, then mpi_finalize_if_initialized().
// Every rank must get its own GPU (NCCL rejects two ranks on one device).
#include <cuda_runtime_api.h>

#include <memory>

#include "runtime/communicator.hpp"

namespace actbench {

// True when this build has the NCCL communicator.
bool nccl_available();

// cudaSetDevice(local rank % device count), the local rank taken from the launcher's
// environment (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID) or else `rank`.
// Returns the device chosen. Throws InvalidArgument when there is no device.
int select_cuda_device_for_rank(int rank);

// Spans MPI_COMM_WORLD (initialising MPI if needed); all collectives are enqueued on
// `stream` (the backend's, so they are ordered with the layer's kernels) except
// start_send_recv's, which go on a non-blocking stream the communicator owns, ordered by
// events: after the work on `stream` so far, and before the work enqueued on `stream` after
// the handle's wait() (cudaStreamWaitEvent; the host never waits). The
// reductions run in the tensors' dtype (NCCL rounds 16-bit sums per step, unlike the MPI
// communicator which sums in fp32). mode() is CommMode::nccl.
std::unique_ptr<Communicator> make_nccl_communicator(cudaStream_t stream);

// The ranks of `world` (a communicator from make_nccl_communicator) that pass the same
// `color`, ranked by `key`, on world's stream: ncclCommSplit for the tensors (NCCL 2.18 or
// newer) and MPI_Comm_split for the host-side helpers and barrier(). Every rank of world calls
// it together. send_recv, all_to_all and all_to_all_v are grouped ncclSend/ncclRecv (a self
// send_recv is a device copy; all_to_all_v makes no call for a zero count).
std::unique_ptr<Communicator> split_nccl_communicator(Communicator& world, int color, int key);

}  // namespace actbench
