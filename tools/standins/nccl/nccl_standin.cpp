// An NCCL stand-in over MPI for the subset actbench's cuda backend calls (comm_nccl.cpp),
// written from the NCCL documentation. Types come from the toolkit's <nccl.h>; the library
// links MPI and no NVIDIA library. Buffers are host pointers (the simulator's device memory is
// host memory). Streams are ignored: every collective has completed when it returns, which is
// a legal schedule of the stream-ordered original for a caller that synchronises anyway.
//
// One process per rank (mpirun); a communicator from ncclCommInitRank spans all of
// MPI_COMM_WORLD (nranks must be the world size), ranks ordered by the rank given to it;
// ncclCommSplit makes communicators over parts of one (MPI_Comm_split of its ranks).
// Point-to-point calls (ncclSend/ncclRecv) inside a group wait for the outermost
// ncclGroupEnd, which posts them all at once, so a ring of sends and receives cannot
// deadlock; outside a group each runs alone, as in NCCL. Reductions combine
// the ranks' contributions in rank order 0, 1, ..., n-1, each step computed in fp32 (fp64 for
// ncclFloat64, the integer type for integers) and rounded to the element type, so every rank
// gets bit-identical results. In-place: sendbuff == recvbuff (all-reduce), sendbuff ==
// recvbuff + rank * sendcount (all-gather), recvbuff == sendbuff + rank * recvcount
// (reduce-scatter); any other overlap is also handled (inputs are copied first).
#include <fcntl.h>
#include <nccl.h>
#include <unistd.h>
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tools/standins/common/half_bits.hpp"

using actbench::standin::bf16_to_float;
using actbench::standin::float_to_bf16;
using actbench::standin::float_to_fp16;
using actbench::standin::fp16_to_float;

struct ncclComm {
  uint32_t magic = 0x4e63436d;
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, nranks = 0;
  ncclResult_t async_error = ncclSuccess;
  bool finalized = false;
  std::string last_error;
};

namespace {

constexpr uint32_t kIdMagic = 0x6e63634d;  // first bytes of a stand-in ncclUniqueId
constexpr int kP2pTag = 0x4e53;             // the MPI tag of ncclSend/ncclRecv messages
int group_depth = 0;
std::string last_global_error;

// An ncclSend or ncclRecv waiting for the end of its group.
struct P2p {
  ncclComm* comm;
  bool send;
  void* buf;
  size_t bytes;
  int peer;
};
std::vector<P2p> pending_p2p;

bool valid(const ncclComm* c) { return c && c->magic == 0x4e63436d; }

// The simulator's stream log (CUDASIM_STREAM_LOG, tools/cudasim/src/stream_log.hpp): each
// operation, once its arguments are checked, as the stream work it is on a GPU, appended to
// the same file (one write(2) per line, so the lines interleave with the simulator's in issue
// order): what=nccl stream=S name=OP reads=P+BYTES writes=P+BYTES.
void log_stream_op(const char* op, cudaStream_t stream, const void* read, size_t read_bytes, const void* write_to,
                   size_t write_bytes) {
  static const int fd = [] {
    const char* path = std::getenv("CUDASIM_STREAM_LOG");
    if (!path || !*path) return -1;
    const std::string file = std::string(path) + "." + std::to_string(getpid());
    return open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  }();
  if (fd < 0) return;
  auto range = [](const void* p, size_t n) {
    char b[48];
    std::snprintf(b, sizeof b, "%#llx+%zu", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p)), n);
    return std::string(b);
  };
  char s[24];
  std::snprintf(s, sizeof s, "%#llx", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(stream)));
  const std::string line = std::string("what=nccl stream=") + (stream ? s : "0x0") + " name=" + op +
                           " reads=" + (read ? range(read, read_bytes) : "") +
                           " writes=" + (write_to ? range(write_to, write_bytes) : "") + "\n";
  if (write(fd, line.data(), line.size()) < 0) std::perror("NCCL stand-in: stream log");
}

ncclResult_t fail(ncclComm* comm, ncclResult_t r, const std::string& why) {
  const std::string msg = "NCCL stand-in: " + why;
  if (comm) comm->last_error = msg;
  last_global_error = msg;
  return r;
}

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

// MPI moves bytes; counts above INT_MAX go in chunks of whole elements per rank.
ncclResult_t mpi_failed(ncclComm* comm, int rc, const char* what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  comm->async_error = ncclSystemError;
  return fail(comm, ncclSystemError, std::string(what) + ": " + std::string(msg, static_cast<size_t>(len)));
}

// all[r * bytes .. ] = rank r's `mine` (bytes each), in chunks that fit an int.
ncclResult_t allgather_bytes(ncclComm* comm, const uint8_t* mine, uint8_t* all, size_t bytes) {
  const size_t chunk_max = static_cast<size_t>(INT_MAX);
  std::vector<uint8_t> piece;
  for (size_t done = 0; done < bytes;) {
    const size_t chunk = std::min(chunk_max, bytes - done);
    piece.resize(chunk * static_cast<size_t>(comm->nranks));
    const int rc = MPI_Allgather(mine + done, static_cast<int>(chunk), MPI_BYTE, piece.data(), static_cast<int>(chunk),
                                 MPI_BYTE, comm->mpi);
    if (rc != MPI_SUCCESS) return mpi_failed(comm, rc, "MPI_Allgather");
    for (int r = 0; r < comm->nranks; ++r)
      std::memcpy(all + static_cast<size_t>(r) * bytes + done, piece.data() + static_cast<size_t>(r) * chunk, chunk);
    done += chunk;
  }
  return ncclSuccess;
}

// recv[r * bytes ..] = rank r's send[rank * bytes ..]: MPI_Alltoall in chunks that fit an int.
ncclResult_t alltoall_bytes(ncclComm* comm, const uint8_t* send, uint8_t* recv, size_t bytes) {
  const size_t n = static_cast<size_t>(comm->nranks);
  std::vector<uint8_t> out, in;
  for (size_t done = 0; done < bytes;) {
    const size_t chunk = std::min(static_cast<size_t>(INT_MAX) / n, bytes - done);
    out.resize(chunk * n);
    in.resize(chunk * n);
    for (size_t r = 0; r < n; ++r) std::memcpy(out.data() + r * chunk, send + r * bytes + done, chunk);
    const int rc = MPI_Alltoall(out.data(), static_cast<int>(chunk), MPI_BYTE, in.data(), static_cast<int>(chunk),
                                MPI_BYTE, comm->mpi);
    if (rc != MPI_SUCCESS) return mpi_failed(comm, rc, "MPI_Alltoall");
    for (size_t r = 0; r < n; ++r) std::memcpy(recv + r * bytes + done, in.data() + r * chunk, chunk);
    done += chunk;
  }
  return ncclSuccess;
}

// Posts every operation at once and waits for all. A message above INT_MAX bytes goes in
// chunks: both ends cut it alike (NCCL wants the same count and type on both), and MPI keeps
// the order of the messages between two ranks on one communicator and tag.
ncclResult_t run_p2p(const std::vector<P2p>& ops) {
  std::vector<MPI_Request> requests;
  std::vector<std::pair<const P2p*, int>> chunk_of;  // op and chunk bytes, per request
  for (const P2p& op : ops)
    for (size_t done = 0; done < op.bytes;) {
      const int chunk = static_cast<int>(std::min(static_cast<size_t>(INT_MAX), op.bytes - done));
      auto* at = static_cast<uint8_t*>(op.buf) + done;
      MPI_Request request = MPI_REQUEST_NULL;
      const int rc = op.send ? MPI_Isend(at, chunk, MPI_BYTE, op.peer, kP2pTag, op.comm->mpi, &request)
                             : MPI_Irecv(at, chunk, MPI_BYTE, op.peer, kP2pTag, op.comm->mpi, &request);
      if (rc != MPI_SUCCESS) return mpi_failed(op.comm, rc, op.send ? "MPI_Isend" : "MPI_Irecv");
      requests.push_back(request);
      chunk_of.emplace_back(&op, chunk);
      done += static_cast<size_t>(chunk);
    }
  std::vector<MPI_Status> statuses(requests.size());
  const int rc = MPI_Waitall(static_cast<int>(requests.size()), requests.data(), statuses.data());
  if (rc != MPI_SUCCESS) return mpi_failed(ops.front().comm, rc, "MPI_Waitall (a peer sent more than was received?)");
  for (size_t i = 0; i < statuses.size(); ++i) {
    const auto& [op, chunk] = chunk_of[i];
    int got = 0;
    MPI_Get_count(&statuses[i], MPI_BYTE, &got);
    if (!op->send && got != chunk)
      return fail(op->comm, ncclInvalidUsage, "ncclRecv from rank " + std::to_string(op->peer) + " expected " +
                                                  std::to_string(op->bytes) + " bytes but the peer sent fewer");
  }
  return ncclSuccess;
}

// Queues a send or receive; outside a group it runs at once.
ncclResult_t post_p2p(const P2p& op) {
  if (op.bytes == 0) return ncclSuccess;
  pending_p2p.push_back(op);
  if (group_depth > 0) return ncclSuccess;
  std::vector<P2p> ops;
  ops.swap(pending_p2p);
  return run_p2p(ops);
}

template <class T>
T apply(ncclRedOp_t op, T x, T y) {
  switch (op) {
    case ncclProd: return static_cast<T>(x * y);
    case ncclMax: return x > y ? x : y;
    case ncclMin: return x < y ? x : y;
    default: return static_cast<T>(x + y);  // sum, avg (divided at the end)
  }
}

// out[i] = in[0][i] op in[1][i] op ... in rank order; `stride` elements between ranks' data.
template <class T, class Load, class Store>
void reduce_ranks(ncclRedOp_t op, const uint8_t* in, size_t stride_bytes, int nranks, size_t count, uint8_t* out,
                  Load load, Store store) {
  for (size_t i = 0; i < count; ++i) {
    T acc = load(in, i);
    for (int r = 1; r < nranks; ++r) acc = apply<T>(op, acc, load(in + static_cast<size_t>(r) * stride_bytes, i));
    if (op == ncclAvg) acc = static_cast<T>(acc / static_cast<T>(nranks));
    store(out, i, acc);
  }
}

template <class T>
void reduce_native(ncclRedOp_t op, const uint8_t* in, size_t stride, int nranks, size_t count, uint8_t* out) {
  reduce_ranks<T>(
      op, in, stride, nranks, count, out,
      [](const uint8_t* p, size_t i) {
        T v;
        std::memcpy(&v, p + i * sizeof(T), sizeof(T));
        return v;
      },
      [](uint8_t* p, size_t i, T v) { std::memcpy(p + i * sizeof(T), &v, sizeof(T)); });
}

// 16-bit floats: each step in fp32, rounded back to the type (what a per-step reduction stores).
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void reduce_half(ncclRedOp_t op, const uint8_t* in, size_t stride, int nranks, size_t count, uint8_t* out) {
  auto load = [](const uint8_t* p, size_t i) {
    uint16_t h;
    std::memcpy(&h, p + i * 2, 2);
    return ToFloat(h);
  };
  for (size_t i = 0; i < count; ++i) {
    float acc = load(in, i);
    for (int r = 1; r < nranks; ++r)
      acc = ToFloat(FromFloat(apply<float>(op, acc, load(in + static_cast<size_t>(r) * stride, i))));
    if (op == ncclAvg) acc = acc / static_cast<float>(nranks);
    const uint16_t h = FromFloat(acc);
    std::memcpy(out + i * 2, &h, 2);
  }
}

ncclResult_t reduce(ncclDataType_t t, ncclRedOp_t op, const uint8_t* in, size_t stride, int nranks, size_t count,
                    uint8_t* out) {
  switch (t) {
    case ncclInt8: reduce_native<int8_t>(op, in, stride, nranks, count, out); break;
    case ncclUint8: reduce_native<uint8_t>(op, in, stride, nranks, count, out); break;
    case ncclInt32: reduce_native<int32_t>(op, in, stride, nranks, count, out); break;
    case ncclUint32: reduce_native<uint32_t>(op, in, stride, nranks, count, out); break;
    case ncclInt64: reduce_native<int64_t>(op, in, stride, nranks, count, out); break;
    case ncclUint64: reduce_native<uint64_t>(op, in, stride, nranks, count, out); break;
    case ncclFloat32: reduce_native<float>(op, in, stride, nranks, count, out); break;
    case ncclFloat64: reduce_native<double>(op, in, stride, nranks, count, out); break;
    case ncclFloat16: reduce_half<fp16_to_float, float_to_fp16>(op, in, stride, nranks, count, out); break;
    case ncclBfloat16: reduce_half<bf16_to_float, float_to_bf16>(op, in, stride, nranks, count, out); break;
    default: return ncclInvalidArgument;  // fp8 reductions are not modelled
  }
  return ncclSuccess;
}

// Argument checks every collective shares (NCCL reports these as ncclInvalidArgument).
ncclResult_t check_call(ncclComm* comm, const void* send, const void* recv, size_t count, ncclDataType_t t,
                        const char* what) {
  if (!valid(comm)) return fail(nullptr, ncclInvalidArgument, std::string(what) + ": invalid communicator");
  if (comm->finalized) return fail(comm, ncclInvalidUsage, std::string(what) + ": communicator is finalized");
  if (type_bytes(t) == 0) return fail(comm, ncclInvalidArgument, std::string(what) + ": invalid datatype");
  if (count > 0 && (!send || !recv)) return fail(comm, ncclInvalidArgument, std::string(what) + ": null buffer");
  return ncclSuccess;
}

ncclResult_t check_peer(ncclComm* comm, int peer, const char* what) {
  if (peer < 0 || peer >= comm->nranks)
    return fail(comm, ncclInvalidArgument, std::string(what) + ": peer " + std::to_string(peer) +
                                               " is not a rank of this communicator of " +
                                               std::to_string(comm->nranks));
  return ncclSuccess;
}

ncclResult_t check_op(ncclComm* comm, ncclRedOp_t op, ncclDataType_t t, const char* what) {
  if (op < ncclSum || op >= ncclNumOps)
    return fail(comm, ncclInvalidArgument, std::string(what) + ": invalid or user-defined reduction op");
  if (t == ncclFloat8e4m3 || t == ncclFloat8e5m2)  // checked before any rank communicates
    return fail(comm, ncclInvalidArgument, std::string(what) + ": fp8 reductions are not modelled by the stand-in");
  return ncclSuccess;
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return fail(nullptr, ncclInvalidArgument, "ncclGetVersion: null pointer");
  *version = NCCL_VERSION_CODE;  // the headers it was built against: the same interface
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error (NCCL stand-in: an MPI call failed)";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  return valid(comm) ? comm->last_error.c_str() : last_global_error.c_str();
}

// 128 bytes: a tag, then random bytes that every rank of one communicator must share.
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (!uniqueId) return fail(nullptr, ncclInvalidArgument, "ncclGetUniqueId: null pointer");
  std::memset(uniqueId, 0, sizeof *uniqueId);
  std::memcpy(uniqueId->internal, &kIdMagic, sizeof kIdMagic);
  std::random_device rd;
  for (size_t i = 8; i + 4 <= sizeof uniqueId->internal; i += 4) {
    const uint32_t v = rd();
    std::memcpy(uniqueId->internal + i, &v, 4);
  }
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  if (!comm) return fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: null comm pointer");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(nullptr, ncclInvalidArgument,
                "ncclCommInitRank: rank " + std::to_string(rank) + " of " + std::to_string(nranks) + " is invalid");
  uint32_t magic = 0;
  std::memcpy(&magic, commId.internal, sizeof magic);
  if (magic != kIdMagic)
    return fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: the unique id does not come from ncclGetUniqueId");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return fail(nullptr, ncclInvalidUsage, "ncclCommInitRank: MPI is not initialized");
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (nranks != world)
    return fail(nullptr, ncclInvalidUsage,
                "ncclCommInitRank: nranks " + std::to_string(nranks) + " differs from the MPI world size " +
                    std::to_string(world) + " (the stand-in spans MPI_COMM_WORLD)");
  // Every rank must bring the same id and a distinct rank: checked collectively, so all ranks
  // fail together instead of hanging later.
  struct Entry {
    char id[NCCL_UNIQUE_ID_BYTES];
    int rank;
  } mine{}, first{};
  std::memcpy(mine.id, commId.internal, NCCL_UNIQUE_ID_BYTES);
  mine.rank = rank;
  std::vector<Entry> all(static_cast<size_t>(world));
  if (MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, MPI_COMM_WORLD) != MPI_SUCCESS)
    return fail(nullptr, ncclSystemError, "ncclCommInitRank: MPI_Allgather failed");
  first = all[0];
  std::vector<int> seen(static_cast<size_t>(nranks), 0);
  for (const Entry& e : all) {
    if (std::memcmp(e.id, first.id, NCCL_UNIQUE_ID_BYTES) != 0)
      return fail(nullptr, ncclInvalidUsage, "ncclCommInitRank: ranks passed different unique ids");
    if (e.rank < 0 || e.rank >= nranks || seen[static_cast<size_t>(e.rank)]++)
      return fail(nullptr, ncclInvalidUsage, "ncclCommInitRank: ranks are not a permutation of 0.." +
                                                 std::to_string(nranks - 1));
  }
  auto* c = new (std::nothrow) ncclComm;
  if (!c) return fail(nullptr, ncclSystemError, "ncclCommInitRank: out of memory");
  if (MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &c->mpi) != MPI_SUCCESS) {
    delete c;
    return fail(nullptr, ncclSystemError, "ncclCommInitRank: MPI_Comm_split failed");
  }
  MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);  // MPI failures become ncclSystemError
  c->rank = rank;
  c->nranks = nranks;
  *comm = c;
  return ncclSuccess;
}

// The ranks of `comm` with the same color, ordered by key (ties by their rank in comm):
// MPI_Comm_split of comm's ranks, collective over comm. NCCL_SPLIT_NOCOLOR gives a null
// communicator. `config` is accepted and ignored (every call here is blocking).
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  if (!newcomm) return fail(nullptr, ncclInvalidArgument, "ncclCommSplit: null newcomm pointer");
  *newcomm = nullptr;
  if (!valid(comm)) return fail(nullptr, ncclInvalidArgument, "ncclCommSplit: invalid communicator");
  if (comm->finalized) return fail(comm, ncclInvalidUsage, "ncclCommSplit: communicator is finalized");
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return fail(comm, ncclInvalidArgument, "ncclCommSplit: color " + std::to_string(color) +
                                               " is negative (only NCCL_SPLIT_NOCOLOR may be)");
  MPI_Comm sub = MPI_COMM_NULL;
  const int rc = MPI_Comm_split(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &sub);
  if (rc != MPI_SUCCESS) return mpi_failed(comm, rc, "MPI_Comm_split");
  if (sub == MPI_COMM_NULL) return ncclSuccess;
  auto* c = new (std::nothrow) ncclComm;
  if (!c) {
    MPI_Comm_free(&sub);
    return fail(comm, ncclSystemError, "ncclCommSplit: out of memory");
  }
  MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
  c->mpi = sub;
  MPI_Comm_rank(sub, &c->rank);
  MPI_Comm_size(sub, &c->nranks);
  *newcomm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!valid(comm)) return fail(nullptr, ncclInvalidArgument, "ncclCommFinalize: invalid communicator");
  comm->finalized = true;  // nothing is ever pending: operations complete before they return
  return ncclSuccess;
}

static ncclResult_t release(ncclComm_t comm, const char* what) {
  if (!valid(comm)) return fail(nullptr, ncclInvalidArgument, std::string(what) + ": invalid communicator");
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm->mpi != MPI_COMM_NULL) MPI_Comm_free(&comm->mpi);
  comm->magic = 0;
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return release(comm, "ncclCommDestroy"); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return release(comm, "ncclCommAbort"); }

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!valid(comm) || !asyncError) return fail(nullptr, ncclInvalidArgument, "ncclCommGetAsyncError: invalid argument");
  *asyncError = comm->async_error;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!valid(comm) || !count) return fail(nullptr, ncclInvalidArgument, "ncclCommCount: invalid argument");
  *count = comm->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!valid(comm) || !rank) return fail(nullptr, ncclInvalidArgument, "ncclCommUserRank: invalid argument");
  *rank = comm->rank;
  return ncclSuccess;
}

// Group calls only nest: the collectives inside already ran, in call order, on every rank.
ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return fail(nullptr, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--group_depth > 0 || pending_p2p.empty()) return ncclSuccess;
  std::vector<P2p> ops;
  ops.swap(pending_p2p);
  return run_p2p(ops);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  ncclResult_t r = check_call(comm, sendbuff, sendbuff, count, datatype, "ncclSend");
  if (r == ncclSuccess) r = check_peer(comm, peer, "ncclSend");
  if (r != ncclSuccess) return r;
  log_stream_op("send", stream, sendbuff, count * type_bytes(datatype), nullptr, 0);
  return post_p2p({comm, true, const_cast<void*>(sendbuff), count * type_bytes(datatype), peer});
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  ncclResult_t r = check_call(comm, recvbuff, recvbuff, count, datatype, "ncclRecv");
  if (r == ncclSuccess) r = check_peer(comm, peer, "ncclRecv");
  if (r != ncclSuccess) return r;
  log_stream_op("recv", stream, nullptr, 0, recvbuff, count * type_bytes(datatype));
  return post_p2p({comm, false, recvbuff, count * type_bytes(datatype), peer});
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  ncclResult_t r = check_call(comm, sendbuff, recvbuff, count, datatype, "ncclAllReduce");
  if (r == ncclSuccess) r = check_op(comm, op, datatype, "ncclAllReduce");
  if (r != ncclSuccess || count == 0) return r;
  const size_t bytes = count * type_bytes(datatype);
  log_stream_op("all_reduce", stream, sendbuff, bytes, recvbuff, bytes);
  std::vector<uint8_t> all(bytes * static_cast<size_t>(comm->nranks));
  r = allgather_bytes(comm, static_cast<const uint8_t*>(sendbuff), all.data(), bytes);
  if (r != ncclSuccess) return r;
  return reduce(datatype, op, all.data(), bytes, comm->nranks, count, static_cast<uint8_t*>(recvbuff));
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  ncclResult_t r = check_call(comm, sendbuff, recvbuff, sendcount, datatype, "ncclAllGather");
  if (r != ncclSuccess || sendcount == 0) return r;
  const size_t bytes = sendcount * type_bytes(datatype);
  log_stream_op("all_gather", stream, sendbuff, bytes, recvbuff, bytes * static_cast<size_t>(comm->nranks));
  // The input is copied first: in place it is rank's own slot of recvbuff.
  const std::vector<uint8_t> mine(static_cast<const uint8_t*>(sendbuff), static_cast<const uint8_t*>(sendbuff) + bytes);
  return allgather_bytes(comm, mine.data(), static_cast<uint8_t*>(recvbuff), bytes);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  ncclResult_t r = check_call(comm, sendbuff, recvbuff, recvcount, datatype, "ncclReduceScatter");
  if (r == ncclSuccess) r = check_op(comm, op, datatype, "ncclReduceScatter");
  if (r != ncclSuccess || recvcount == 0) return r;
  const size_t bytes = recvcount * type_bytes(datatype), n = static_cast<size_t>(comm->nranks);
  log_stream_op("reduce_scatter", stream, sendbuff, bytes * n, recvbuff, bytes);
  // Block r of every rank's input goes to rank r (all-to-all), which reduces the n blocks it
  // receives in rank order. The input is copied first: in place, the output overlaps it.
  const std::vector<uint8_t> mine(static_cast<const uint8_t*>(sendbuff),
                                  static_cast<const uint8_t*>(sendbuff) + bytes * n);
  std::vector<uint8_t> blocks(bytes * n);
  r = alltoall_bytes(comm, mine.data(), blocks.data(), bytes);
  if (r != ncclSuccess) return r;
  return reduce(datatype, op, blocks.data(), bytes, comm->nranks, recvcount, static_cast<uint8_t*>(recvbuff));
}

}  // extern "C"
