// A kernel that runs for a given time: one thread spins on %globaltimer (nanoseconds) until
// `nanos` have passed. The fault matrix's stand-in for asynchronous work that runs long: a
// stall of an asynchronous call on the real GPU queues it on the call's stream, so the
// driver itself answers NOT_READY to queries until the deadline has passed.

extern "C" __global__ void spin_ns(unsigned long long nanos) {
    unsigned long long start;
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < nanos);
}
