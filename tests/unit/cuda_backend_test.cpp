// RONDE_CUDA_BACKEND, the choice of backend for CUDA tensors: checked by
// init() before any rendezvous, with a message that names the setting.
#include <ronde/ronde.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace {

class CudaBackendSetting : public ::testing::Test {
 protected:
  void TearDown() override {
    unsetenv("RONDE_CUDA_BACKEND");
    if (ronde::is_initialized())
      ronde::shutdown();
  }
  static std::string init_error(const char* value) {
    setenv("RONDE_CUDA_BACKEND", value, 1);
    try {
      ronde::init();
    } catch (const c10::Error& e) {
      return e.what_without_backtrace();
    }
    return "";
  }
};

TEST_F(CudaBackendSetting, AnUnknownValueFailsInitAndNamesIt) {
  std::string msg = init_error("mpi");
  EXPECT_NE(
      msg.find("RONDE_CUDA_BACKEND must be 'nccl' or 'gloo', not 'mpi'"),
      std::string::npos)
      << msg;
  EXPECT_FALSE(ronde::is_initialized());
}

TEST_F(CudaBackendSetting, NcclIsRefusedWhenNotBuilt) {
  if (ronde::nccl_built())
    GTEST_SKIP() << "this ronde has the NCCL backend";
  std::string msg = init_error("nccl");
  EXPECT_NE(msg.find("built without NCCL"), std::string::npos) << msg;
  EXPECT_NE(msg.find("RONDE_WITH_NCCL=ON"), std::string::npos) << msg;
  EXPECT_FALSE(ronde::is_initialized());
}

TEST_F(CudaBackendSetting, AValidChoiceInitializes) {
  for (const char* value : {"gloo", ronde::nccl_built() ? "nccl" : ""}) {
    EXPECT_EQ(init_error(value), "") << value;
    ASSERT_TRUE(ronde::is_initialized()) << value;
    // CPU tensors go to the host backend whatever the choice.
    auto t = ronde::allreduce(at::ones({4}));
    EXPECT_TRUE(t.equal(at::ones({4}))) << value;
    ronde::shutdown();
  }
}

}  // namespace
