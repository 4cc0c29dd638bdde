#pragma once
// The stream log (CUDASIM_STREAM_LOG=PATH): every operation the simulated runtime puts on a
// stream, in issue order, with the events that order streams and the host's synchronisations,
// one line each, to PATH.<pid>. The simulator runs work at once, in issue order, so results
// cannot show a missing cross-stream dependency; the log lets a test check the order a GPU
// would enforce (docs/simulator.md, "The stream log"; tools/stream_order.py reads it). Lines
// are `key=value` words:
//   what=kernel stream=S name=N reads=P,P writes=P,P   pointer parameters (const: reads);
//                                                      N without spaces
//   what=copy stream=S reads=P+BYTES writes=P+BYTES [host_sync=1]
//   what=set stream=S writes=P+BYTES
//   what=record stream=S event=E | what=wait stream=S event=E
//   what=sync_stream stream=S | what=sync_device | what=sync_event event=E
//   what=stream stream=S flags=F                          a stream created
// S, E, P in hex; stream 0x0 and 0x1 are the legacy default stream. The NCCL stand-in appends
// its operations to the same file (what=nccl).
#include <cuda_runtime_api.h>

#include <cstddef>

namespace cudasim::stream_log {

bool enabled();
// An outermost runtime call has returned: logs the kernel it launched (name non-null) with the
// pointer parameters noted for it, and forgets them either way.
void call_done(cudaStream_t stream, const char* kernel_name);
void copy(cudaStream_t stream, const void* dst, const void* src, size_t bytes, bool host_sync);
void set(cudaStream_t stream, const void* dst, size_t bytes);
void record(cudaStream_t stream, cudaEvent_t event);
void wait(cudaStream_t stream, cudaEvent_t event);
void sync_stream(cudaStream_t stream);
void sync_device();
void sync_event(cudaEvent_t event);
void stream_created(cudaStream_t stream, unsigned flags);

}  // namespace cudasim::stream_log
