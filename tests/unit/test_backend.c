/* The backend interface (src/backend/backend.h): the registry, the target
 * check's messages, and the GPU architecture lists read the way CMake's
 * CUDA_ARCHITECTURES documentation defines them ("NN": code and PTX,
 * "NN-real": code only, "NN-virtual": PTX only). */
#include "test.h"

#include "backend/backend.h"

static void test_arch_list(void)
{
    int32_t archs[8], ptx[8];
    CHECK(kiln_gpu_archs_parse("90", archs, ptx, 8) == 1 && archs[0] == 90 && ptx[0] == 1);
    CHECK(kiln_gpu_archs_parse("80;90-real;100-virtual", archs, ptx, 8) == 3);
    CHECK(archs[0] == 80 && archs[1] == 90 && archs[2] == 100);
    CHECK(ptx[0] == 1 && ptx[1] == 0 && ptx[2] == 1);
    /* one architecture twice: code from one entry, PTX from the other */
    CHECK(kiln_gpu_archs_parse("90-real;90-virtual", archs, ptx, 8) == 1 && archs[0] == 90 && ptx[0] == 1);
    CHECK(kiln_gpu_archs_parse("", archs, ptx, 8) == 0);
    CHECK(kiln_gpu_archs_parse("all", archs, ptx, 8) == 0);
    CHECK(kiln_gpu_archs_parse("70,75 80", archs, ptx, 2) == 2 && archs[1] == 75);
}

static void test_arch_format(void)
{
    char buf[64];
    const int32_t two[2] = {80, 90};
    kiln_gpu_archs_format(2, two, buf, sizeof buf);
    CHECK(strcmp(buf, "sm_80, sm_90") == 0);
    kiln_gpu_archs_format(0, two, buf, sizeof buf);
    CHECK(strcmp(buf, "no GPU architecture recorded") == 0);
    kiln_gpu_archs_format(9, two, buf, sizeof buf); /* a corrupt count is none */
    CHECK(strcmp(buf, "no GPU architecture recorded") == 0);
}

static void test_registry(void)
{
    const kiln_backend_i *cpu = kiln_backend_find(KILN_BACKEND_CPU);
    CHECK(cpu && cpu->kind == KILN_BACKEND_CPU);
    CHECK(cpu && cpu->engine_create && cpu->engine_destroy && cpu->mem_alloc && cpu->mem_free && cpu->context_create &&
          cpu->context_destroy && cpu->enqueue && cpu->synchronize && cpu->run_reference && cpu->copy);
    /* the CPU has no graph mode or device timing: the runtime says so */
    CHECK(cpu && !cpu->set_graph_mode && !cpu->gpu_time);
    const kiln_backend_i *cuda = kiln_backend_find(KILN_BACKEND_CUDA);
#ifdef KILN_HAVE_CUDA
    CHECK(cuda && cuda->kind == KILN_BACKEND_CUDA && cuda->set_graph_mode && cuda->tune_layer);
#else
    CHECK(cuda == NULL);
#endif

    kiln_engine_header_info info;
    memset(&info, 0, sizeof info);
    const kiln_backend_i *got = NULL;
    info.backend = KILN_BACKEND_CPU;
    CHECK_OK(kiln_backend_for_target(&info, &got));
    CHECK(got == cpu);
    info.backend = (kiln_backend)7;
    CHECK_FAILS(kiln_backend_for_target(&info, &got), KILN_ERROR_TARGET, "unknown backend 7");
    info.backend = KILN_BACKEND_CUDA;
    info.n_gpu_archs = 1;
    info.gpu_archs[0] = 90;
    got = NULL;
    kiln_status s = kiln_backend_for_target(&info, &got);
#ifdef KILN_HAVE_CUDA
    int32_t arch = 0;
    if (!cuda->device_arch(&arch))
        CHECK(s == KILN_ERROR_TARGET &&
              strstr(kiln_last_error(), "engine targets cuda (sm_90), but no CUDA GPU is available"));
    else if (arch == 90)
        CHECK(s == KILN_OK && got == cuda);
#else
    CHECK(s == KILN_ERROR_TARGET && got == NULL &&
          strstr(kiln_last_error(), "engine targets cuda (sm_90), but this kiln was built without CUDA"));
#endif
}

static const test_case_ tests[] = {TEST(test_arch_list), TEST(test_arch_format), TEST(test_registry)};
TEST_MAIN(tests)
