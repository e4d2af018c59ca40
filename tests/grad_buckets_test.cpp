// The gradient buckets of the data-parallel reduction (issue 8): GradBuckets' grouping and its
// errors, and Model::backward's GradReadyHook — every range it reports is already final (equal to
// the gradient at the end of the backward) and the ranges tile the flat buffer from the end.
#include <catch2/catch.hpp>

#include <utility>
#include <vector>

#include "core/rng.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "train/grad_buckets.h"

using namespace llmt;
using Catch::Matchers::Contains;
using Range = std::pair<int64_t, int64_t>;

TEST_CASE("grad buckets: consecutive ranges joined into buckets of at least min_elements", "[dist]") {
  std::vector<Range> launched;
  GradBuckets b(10, 3, [&](int64_t begin, int64_t end) { launched.emplace_back(begin, end); });
  b.ready(8, 10);  // 2 elements: not yet a bucket
  CHECK(launched.empty());
  b.ready(5, 8);  // [5, 10): 5 >= 3
  CHECK(launched == std::vector<Range>{{5, 10}});
  b.ready(5, 5);  // an empty range (a block without parameters)
  b.ready(4, 5);
  CHECK_THROWS_WITH(b.check_complete(), Contains("down to element 4"));
  b.ready(0, 4);  // reaches 0: the rest is the last bucket, smaller or not
  CHECK(launched == std::vector<Range>{{5, 10}, {0, 5}});
  b.check_complete();
}

TEST_CASE("grad buckets: ranges out of layout order are refused", "[dist]") {
  GradBuckets b(10, 3, [](int64_t, int64_t) {});
  CHECK_THROWS_WITH(b.ready(5, 9), Contains("[5, 9)") && Contains("must end at 10"));
  b.ready(6, 10);
  CHECK_THROWS_WITH(b.ready(0, 5), Contains("must end at 6"));
  CHECK_THROWS_WITH(b.ready(7, 6), Contains("[7, 6)"));
  CHECK_THROWS_WITH(GradBuckets(10, 0, [](int64_t, int64_t) {}), Contains("at least 0"));
}

TEST_CASE("model: backward reports gradient ranges that are final, tiling the buffer from the end",
          "[dist][model]") {
  struct Variant {
    const char* name;
    bool tie, hybrid, recompute;
  };
  for (const Variant& variant : {Variant{"untied", false, false, false}, Variant{"tied", true, false, false},
                                 Variant{"GDN / attention hybrid, recompute", false, true, true}}) {
    DYNAMIC_SECTION(variant.name) {
      ModelConfig m;
      m.d_model = 8;
      m.n_layers = 2;
      m.vocab_size = 11;
      m.tie_embeddings = variant.tie;
      m.mlp.intermediate_size = 12;
      m.attn.num_heads = 2;
      m.attn.head_dim = 4;
      m.init_std = 0.3;
      if (variant.hybrid) {
        m.type = "gdn";
        m.gdn.num_heads = 2;
        m.gdn.head_dim = 4;
        m.gdn.chunk_size = 4;
        m.attn_layers = {1};
      }
      auto be = make_cpu_backend();
      Model model(m);
      model.allocate(*be, DType::f64);
      model.params().initialize(4);
      const int64_t B = 2, T = 6, rows = B * T;
      model.plan(B, T, variant.recompute);
      Philox rng(5, 0);
      std::vector<int32_t> ids(rows * 2);
      for (auto& id : ids) id = static_cast<int32_t>(rng.below(11));
      const double* g = model.params().flat_grads().as<double>();
      be->fill_zero(model.params().flat_grads());
      // Two micro-batches: the ranges of the second backward are final for the accumulated sum.
      model.forward(ids.data(), ids.data() + rows, true, 0.5);
      model.backward();
      model.forward(ids.data() + rows, ids.data(), true, 0.5);
      std::vector<Range> ranges;
      std::vector<std::vector<double>> at_report;
      model.backward([&](int64_t begin, int64_t end) {
        ranges.emplace_back(begin, end);
        at_report.emplace_back(g + begin, g + end);
      });
      const int64_t total = model.params().total();
      REQUIRE(ranges.size() == static_cast<size_t>(m.n_layers + 2));  // final norm (+ head), blocks, embedding
      CHECK(ranges.front().second == total);
      CHECK(ranges.back().first == 0);
      for (size_t i = 0; i + 1 < ranges.size(); ++i) CHECK(ranges[i + 1].second == ranges[i].first);
      for (size_t i = 0; i < ranges.size(); ++i) {
        INFO("range " << i << ": [" << ranges[i].first << ", " << ranges[i].second << ")");
        CHECK(ranges[i].first < ranges[i].second);
        CHECK(at_report[i] == std::vector<double>(g + ranges[i].first, g + ranges[i].second));
      }
    }
  }
}
