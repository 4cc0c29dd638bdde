"""tools/stream_order.py on hand-written stream logs: the order CUDA streams and events
guarantee, and the races it finds where they guarantee none (the ring's overlap test in
test_cuda_sim.py relies on it)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import stream_order as so  # noqa: E402

COMPUTE, COMM = "0xc0", "0xc1"
HEAD = ["what=stream stream=%s flags=0" % COMPUTE, "what=stream stream=%s flags=1" % COMM]


def ops_of(*lines):
    return so.order(so.parse(HEAD + list(lines)))


def ring_step(wait=True, ready=True, early_reuse=False):
    """One exchange of the ring: the block written, sent while the next attention computes,
    the received block read after the wait; optionally without the done-event's wait, without
    the ready-event's, or with the send buffer written again before the wait."""
    lines = ["what=kernel stream=%s name=attention_bwd reads=0x100 writes=0x1000" % COMPUTE]
    if ready:
        lines += ["what=record stream=%s event=0xe0" % COMPUTE, "what=wait stream=%s event=0xe0" % COMM]
    lines += ["what=nccl stream=%s name=send reads=0x1000+64 writes=" % COMM,
              "what=nccl stream=%s name=recv reads= writes=0x2000+64" % COMM,
              "what=record stream=%s event=0xe1" % COMM,
              "what=kernel stream=%s name=attention_bwd reads=0x100 writes=%s" %
              (COMPUTE, "0x1000" if early_reuse else "0x3000")]
    if wait:
        lines.append("what=wait stream=%s event=0xe1" % COMPUTE)
    lines.append("what=kernel stream=%s name=add_inplace reads=0x2000 writes=0x4000" % COMPUTE)
    return ops_of(*lines)


class StreamOrderTest(unittest.TestCase):
    def test_one_stream_runs_in_issue_order(self):
        a, b = ops_of("what=kernel stream=0xc0 name=k reads= writes=0x10",
                      "what=kernel stream=0xc0 name=k reads=0x10 writes=")[2:]
        self.assertTrue(so.before(a, b))
        self.assertFalse(so.before(b, a))

    def test_an_event_wait_orders_two_streams_and_only_from_its_record(self):
        ops = ops_of("what=kernel stream=0xc0 name=a reads= writes=0x10",
                     "what=record stream=0xc0 event=0xe",
                     "what=kernel stream=0xc0 name=b reads= writes=0x20",
                     "what=wait stream=0xc1 event=0xe",
                     "what=copy stream=0xc1 reads=0x10+4 writes=0x30+4")
        a, b, copy = ops[2], ops[4], ops[6]
        self.assertTrue(so.before(a, copy))
        self.assertFalse(so.before(b, copy))  # issued after the record
        self.assertEqual(so.races(ops), [])

    def test_host_synchronisation_orders_what_follows(self):
        ops = ops_of("what=nccl stream=0xc1 name=recv reads= writes=0x10+8",
                     "what=sync_stream stream=0xc1",
                     "what=kernel stream=0xc0 name=k reads=0x10 writes=")
        self.assertTrue(so.before(ops[2], ops[4]))
        self.assertEqual(so.races(ops), [])

    def test_the_legacy_stream_waits_for_blocking_streams_but_not_non_blocking_ones(self):
        ops = ops_of("what=kernel stream=0xc0 name=k reads= writes=0x10",
                     "what=nccl stream=0xc1 name=send reads=0x20+4 writes=",
                     "what=copy stream=0x0 reads=0x10+4 writes=0x20+4")
        k, send, copy = ops[2], ops[3], ops[4]
        self.assertTrue(so.before(k, copy))
        self.assertFalse(so.before(send, copy))
        self.assertEqual(so.races(ops), [(send, copy)])

    def test_a_correct_ring_step_has_no_race_and_its_read_waits_on_the_done_event(self):
        ops = ring_step()
        self.assertEqual(so.races(ops), [])
        recv = next(o for o in ops if o.name == "recv")
        reader = so.readers(ops, recv)[0]
        self.assertEqual(reader.name, "add_inplace")
        self.assertTrue(so.before(recv, reader))
        self.assertEqual([w.event for w in so.waits_between(ops, recv, reader)], ["0xe1"])

    def test_each_missing_dependency_is_a_race(self):
        no_wait = ring_step(wait=False)
        self.assertEqual([(a.name, b.name) for a, b in so.races(no_wait)], [("recv", "add_inplace")])
        no_ready = ring_step(ready=False)
        self.assertEqual([(a.name, b.name) for a, b in so.races(no_ready)], [("attention_bwd", "send")])
        reused = ring_step(early_reuse=True)
        self.assertEqual([(a.name, b.name) for a, b in so.races(reused)], [("send", "attention_bwd")])


if __name__ == "__main__":
    unittest.main()
