// What one collective of the split forward pass costs by itself: the time of
// an MPI_Allgather of B bytes per rank (the shape tensor and expert
// parallelism use: every rank contributes its rows, every rank gets all),
// between ranks that do nothing else, by size.
//
// Why: a split decode step pays three or four of these a layer, so their
// latency at the sizes of one token's rows (a few KiB) bounds what tensor
// parallelism can give, and their rate at larger sizes what a batch costs.
// The forward pass's own timing includes the wait for the slowest rank; this
// is the floor under it. Launch it as the model is launched:
//
//   mpirun -np 2 build/mpi_collective_bench [iterations]              (shared memory)
//   mpirun -np 2 --mca btl tcp,self build/mpi_collective_bench         (TCP)
//
// Prints, on rank 0, per size: the median and 90th percentile microseconds
// per call over the iterations, and the bytes every rank received per second.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 2000;
  // Per-rank bytes: one token's slice of a small model's rows up to a batch's.
  const std::vector<size_t> sizes = {256, 1024, 4096, 16384, 65536, 262144, 1048576};
  if (rank == 0) {
    std::printf("%d ranks, %d iterations per size (after 100 warm-up calls)\n", size, iterations);
    std::printf("%12s %12s %12s %14s\n", "bytes/rank", "median us", "p90 us", "recv GB/s");
  }
  for (const size_t bytes : sizes) {
    std::vector<char> mine(bytes, static_cast<char>(rank)), all(bytes * static_cast<size_t>(size));
    std::vector<double> us;
    us.reserve(static_cast<size_t>(iterations));
    for (int i = 0; i < 100 + iterations; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);  // every call starts together: no wait for a late rank is timed
      const double t0 = MPI_Wtime();
      MPI_Allgather(mine.data(), static_cast<int>(bytes), MPI_BYTE, all.data(), static_cast<int>(bytes), MPI_BYTE,
                    MPI_COMM_WORLD);
      const double t = MPI_Wtime() - t0;
      if (i >= 100) us.push_back(t * 1e6);
    }
    // The slowest rank's time is what the pass waits for.
    std::vector<double> slowest(us.size());
    MPI_Reduce(us.data(), slowest.data(), static_cast<int>(us.size()), MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      std::sort(slowest.begin(), slowest.end());
      const double median = slowest[slowest.size() / 2], p90 = slowest[slowest.size() * 9 / 10];
      const double received = static_cast<double>(bytes) * (size - 1);
      std::printf("%12zu %12.1f %12.1f %14.2f\n", bytes, median, p90, received / (median * 1e-6) / 1e9);
    }
  }
  MPI_Finalize();
  return 0;
}
