// The CTAs of a thread-block cluster (sm_90): this CTA's rank in its cluster, a barrier of the whole cluster
// (writes before it, to any CTA's shared memory, are seen after it), and where a shared-memory address of this
// CTA lies in another CTA of the cluster (distributed shared memory, read and written like any address).
// Included by ptycho.cu (qgpu_dask/compile.py inlines it); tests/test_kernels_on_host.py puts host threads'
// versions in its place.

__device__ __forceinline__ unsigned cluster_rank() {
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    return rank;
}

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

template <class T>
__device__ __forceinline__ T* in_cta(T* at, unsigned rank) {
    unsigned long long there;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(there) : "l"(at), "r"(rank));
    return reinterpret_cast<T*>(there);
}
