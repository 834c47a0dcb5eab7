/* The peer of allreduce_bench in MPI: the same sweep, sizes, timing and JSON
 * shape, so that run_allreduce.py can put a line of the machine's MPI
 * (Open MPI's shared memory on one host) beside ronde's in the same rounds.
 * Built by run_allreduce.py with mpicc when mpirun is present, run under
 * mpirun:
 *
 *   mpicc -O2 -o mpi_allreduce_bench benchmarks/mpi_allreduce_bench.c
 *   mpirun -np 2 ./mpi_allreduce_bench -b 4K -e 256M -f 2 --json out.json
 *
 * --op: allreduce (in place, float32 sum), broadcast (in place, from rank
 * 0), allgather (bytes / n per rank) or reducescatter (bytes in, bytes / n
 * out, MPI_Reduce_scatter_block). For each size: -w warm-up calls, then
 * min(200, max(-n, 0.5 s / one call)) timed calls, each between barriers;
 * the median, the largest over ranks, is reported as time, algbw and busbw
 * (nccl-tests' factors, as allreduce_bench). No LibTorch, no ronde. */
#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long long parse_size(const char* s) {
  char* end = NULL;
  double v = strtod(s, &end);
  long long mult = 1;
  if (*end == 'K' || *end == 'k')
    mult = 1LL << 10;
  else if (*end == 'M' || *end == 'm')
    mult = 1LL << 20;
  else if (*end == 'G' || *end == 'g')
    mult = 1LL << 30;
  else if (*end != '\0') {
    fprintf(stderr, "mpi_allreduce_bench: bad size %s\n", s);
    exit(2);
  }
  return (long long)(v * mult);
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(double* v, int n) {
  qsort(v, n, sizeof(double), cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

enum { ALLREDUCE, BROADCAST, ALLGATHER, REDUCESCATTER };
static const char* kOps[] = {"allreduce", "broadcast", "allgather",
                             "reducescatter"};

static float *in_buf, *out_buf;
static long long count_in; /* elements this rank passes */

static void call(int op, int size) {
  switch (op) {
    case ALLREDUCE:
      MPI_Allreduce(MPI_IN_PLACE, in_buf, (int)count_in, MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      break;
    case BROADCAST:
      MPI_Bcast(in_buf, (int)count_in, MPI_FLOAT, 0, MPI_COMM_WORLD);
      break;
    case ALLGATHER:
      MPI_Allgather(in_buf, (int)count_in, MPI_FLOAT, out_buf, (int)count_in,
                    MPI_FLOAT, MPI_COMM_WORLD);
      break;
    default:
      MPI_Reduce_scatter_block(in_buf, out_buf, (int)(count_in / size),
                               MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
}

/* The 90th percentile of one call in the last time_call(), the largest
 * over ranks. */
static double last_p90;

/* Median seconds of one call, the largest over ranks. */
static double time_call(int op, int size, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i)
    call(op, size);
  double* s = malloc(sizeof(double) * iters);
  for (int i = 0; i < iters; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    call(op, size);
    s[i] = MPI_Wtime() - t0;
  }
  double m[2], worst[2];
  m[0] = median(s, iters); /* sorts s */
  m[1] = s[(int)(0.9 * iters) < iters ? (int)(0.9 * iters) : iters - 1];
  free(s);
  MPI_Allreduce(m, worst, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  last_p90 = worst[1];
  return worst[0];
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long long begin = 4 << 10, end = 256LL << 20;
  double factor = 2;
  int warmup = 3, min_iters = 5, op = ALLREDUCE;
  const char* json = NULL;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (v == NULL) {
      fprintf(stderr, "mpi_allreduce_bench: %s needs a value\n", a);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    ++i;
    if (!strcmp(a, "-b"))
      begin = parse_size(v);
    else if (!strcmp(a, "-e"))
      end = parse_size(v);
    else if (!strcmp(a, "-f"))
      factor = atof(v);
    else if (!strcmp(a, "-w"))
      warmup = atoi(v);
    else if (!strcmp(a, "-n"))
      min_iters = atoi(v);
    else if (!strcmp(a, "--json"))
      json = v;
    else if (!strcmp(a, "--op")) {
      op = -1;
      for (int k = 0; k < 4; ++k)
        if (!strcmp(v, kOps[k]))
          op = k;
      if (op < 0) {
        fprintf(stderr, "mpi_allreduce_bench: --op %s is not one of "
                        "allreduce, broadcast, allgather, reducescatter\n", v);
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
    } else {
      fprintf(stderr, "mpi_allreduce_bench: unknown argument %s\n", a);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (begin < 4 || factor <= 1) {
    fprintf(stderr, "mpi_allreduce_bench: -b must be at least 4, -f above 1\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const double bus = op == ALLREDUCE ? 2.0 * (size - 1) / size
                     : op == BROADCAST ? 1.0
                                       : (double)(size - 1) / size;
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int vlen = 0;
  MPI_Get_library_version(version, &vlen);
  char* nl = strchr(version, '\n');
  if (nl)
    *nl = '\0';
  for (char* c = version; *c; ++c)
    if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
      *c = ' ';  /* it goes into a JSON string */
  FILE* out = NULL;
  if (rank == 0) {
    printf("# MPI %s, %d ranks, float32, %s\n", kOps[op], size, version);
    printf("%12s %10s %10s %10s\n", "bytes", "time_us", "algbw_GBs",
           "busbw_GBs");
    if (json && !(out = fopen(json, "w"))) {
      perror(json);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (out)
      fprintf(out, "{\"benchmark\":\"allreduce\",\"impl\":\"mpi\",\"op\":"
                   "\"%s\",\"mpi\":\"%s\",\"ranks\":%d,\"dtype\":\"float32\","
                   "\"results\":[", kOps[op], version, size);
  }
  int first = 1;
  for (double b = (double)begin; b <= end; b *= factor) {
    long long count = (long long)b / 4, total, out_count;
    /* Sized as allreduce_bench sizes its tensors. */
    if (op == ALLGATHER) {
      count_in = count / size > 0 ? count / size : 1;
      total = count_in * size * 4;
      out_count = count_in * size;
    } else {
      if (op == REDUCESCATTER)
        count = (count / size > 0 ? count / size : 1) * size;
      count_in = count;
      total = count * 4;
      out_count = count;
    }
    in_buf = malloc(sizeof(float) * count_in);
    out_buf = malloc(sizeof(float) * out_count);
    for (long long i = 0; i < count_in; ++i)
      in_buf[i] = 1.0f;
    memset(out_buf, 0, sizeof(float) * out_count);
    double probe = time_call(op, size, 1, 1);
    int iters = (int)(0.5 / (probe > 1e-6 ? probe : 1e-6));
    iters = iters < min_iters ? min_iters : iters > 200 ? 200 : iters;
    int agreed;
    MPI_Allreduce(&iters, &agreed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    double sec = time_call(op, size, warmup, agreed);
    double algbw = total / sec / 1e9;
    if (rank == 0) {
      printf("%12lld %10.1f %10.3f %10.3f\n", total, sec * 1e6, algbw,
             algbw * bus);
      fflush(stdout);
      if (out)
        fprintf(out, "%s{\"bytes\":%lld,\"iters\":%d,\"time_us\":%.4f,"
                     "\"p90_time_us\":%.4f,"
                     "\"algbw_GBs\":%.6f,\"busbw_GBs\":%.6f}",
                first ? "" : ",", total, agreed, sec * 1e6, last_p90 * 1e6,
                algbw, algbw * bus);
    }
    first = 0;
    free(in_buf);
    free(out_buf);
  }
  if (out) {
    fprintf(out, "]}\n");
    fclose(out);
  }
  MPI_Finalize();
  return 0;
}
