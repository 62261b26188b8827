#include "checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "checkpoint/safetensors.h"
#include "util/files.h"

namespace longhaul {
namespace {
namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_.vocab_size = 16, cfg_.max_seq_len = 8, cfg_.n_layer = 2, cfg_.n_head = 2, cfg_.d_model = 8;
    root_ = fs::path(::testing::TempDir()) / ("ckpt_" + std::to_string(::getpid()) + "_" +
                                              ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    layout_ = std::make_unique<ParamLayout>(cfg_, StageSpec::Whole(cfg_));
    const size_t n = layout_->total();
    p_.resize(n), m_.resize(n), v_.resize(n);
    for (size_t i = 0; i < n; ++i) p_[i] = 0.5f * i, m_[i] = -1.0f * i, v_[i] = 2.0f * i;
  }
  std::string Saved() {
    EXPECT_TRUE(SaveCheckpoint(root_.string(), {42, {{"k", 1}}}, *layout_, p_.data(), m_.data(), v_.data()).ok());
    auto dir = LatestCheckpoint(root_.string());
    EXPECT_TRUE(dir.ok());
    return *dir;
  }
  // Writes 0x7f over the byte `from_end` bytes before the end of file f.
  static void FlipByte(const fs::path& f, size_t from_end) {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(fs::file_size(f) - from_end));
    io.put('\x7f');
  }
  absl::Status Load(const std::string& dir) {
    std::vector<float> p(layout_->total()), m(layout_->total()), v(layout_->total());
    return LoadCheckpoint(dir, *layout_, p.data(), m.data(), v.data()).status();
  }

  ModelConfig cfg_;
  fs::path root_;
  std::unique_ptr<ParamLayout> layout_;
  std::vector<float> p_, m_, v_;
};

TEST_F(CheckpointTest, RoundTripsEverything) {
  const std::string dir = Saved();
  EXPECT_EQ(fs::path(dir).filename(), "step_00000042");
  std::vector<float> p(layout_->total()), m(layout_->total()), v(layout_->total());
  auto data = LoadCheckpoint(dir, *layout_, p.data(), m.data(), v.data());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->step, 42);
  EXPECT_EQ(data->run_config["k"], 1);
  EXPECT_EQ(p, p_);
  EXPECT_EQ(m, m_);
  EXPECT_EQ(v, v_);
  // The model file is plain safetensors with PyTorch-style names and shapes.
  auto st = ReadSafetensors(dir + "/model.safetensors");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->tensors.at("h.1.mlp.c_fc.weight").shape, (std::vector<int64_t>{32, 8}));
  EXPECT_FALSE(fs::exists(dir + ".tmp"));
}

TEST_F(CheckpointTest, TruncatedFileIsNamed) {
  const std::string dir = Saved();
  const fs::path f = fs::path(dir) / "optimizer.safetensors";
  fs::resize_file(f, fs::file_size(f) - 10);
  absl::Status s = Load(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("optimizer.safetensors is truncated"), std::string::npos) << s;
}

TEST_F(CheckpointTest, FlippedByteFailsTheChecksum) {
  const std::string dir = Saved();
  const fs::path f = fs::path(dir) / "model.safetensors";
  FlipByte(f, 5);
  absl::Status s = Load(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("model.safetensors is corrupt"), std::string::npos) << s;
}

// A directory's files are checked against state.json without being parsed: a whole one passes; a
// flipped byte, a truncated or missing file, or a name that is no checkpoint file's is named.
TEST_F(CheckpointTest, VerifyingADirectoryChecksEveryListedFile) {
  const std::string dir = Saved();
  ASSERT_TRUE(VerifyCheckpointDir(dir).ok()) << VerifyCheckpointDir(dir);
  const fs::path optimizer = fs::path(dir) / "optimizer.safetensors", model = fs::path(dir) / "model.safetensors";
  FlipByte(optimizer, 1);
  absl::Status s = VerifyCheckpointDir(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("optimizer.safetensors is corrupt: CRC-32"), std::string::npos) << s;
  fs::remove_all(dir);
  Saved();
  fs::resize_file(model, fs::file_size(model) / 2);
  s = VerifyCheckpointDir(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("model.safetensors is truncated"), std::string::npos) << s;
  fs::remove(model);
  s = VerifyCheckpointDir(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("model.safetensors is missing"), std::string::npos) << s;
  // A state.json that lists a path elsewhere has nothing read from there.
  fs::remove_all(dir);
  Saved();
  std::ifstream in(fs::path(dir) / "state.json");
  nlohmann::json state = nlohmann::json::parse(in);
  in.close();
  state["files"]["../../etc/passwd"] = {{"bytes", 1}, {"crc32", 0}};
  std::ofstream(fs::path(dir) / "state.json") << state.dump();
  s = VerifyCheckpointDir(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("which no checkpoint holds"), std::string::npos) << s;
}

// The file is read straight into the layout's buffers: a shard's slice takes its own tensors, and
// the bytes it skips still count in the CRC.
TEST_F(CheckpointTest, ASliceReadsItsTensorsAndChecksTheWholeFile) {
  const std::string dir = Saved();
  const ParamLayout slice = layout_->Slice(3, 7);
  const size_t begin = layout_->Range(3, 7).first;
  std::vector<float> p(slice.total()), m(slice.total()), v(slice.total());
  ASSERT_TRUE(LoadCheckpoint(dir, slice, p.data(), m.data(), v.data()).ok());
  EXPECT_EQ(p, std::vector<float>(p_.begin() + begin, p_.begin() + begin + p.size()));
  EXPECT_EQ(v, std::vector<float>(v_.begin() + begin, v_.begin() + begin + v.size()));
  const fs::path f = fs::path(dir) / "model.safetensors";
  FlipByte(f, 1);  // the last tensor's, not the slice's
  const absl::Status s = LoadCheckpoint(dir, slice, p.data(), m.data(), v.data()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("model.safetensors is corrupt: CRC-32"), std::string::npos) << s;
}

// Without parameters only the moments are read, from their own file (a recovery reads them off its
// set-up's path, after the parameters): a corrupt model file is not this read's to find.
TEST_F(CheckpointTest, MomentsAloneAreReadFromTheirOwnFile) {
  const std::string dir = Saved();
  const fs::path f = fs::path(dir) / "model.safetensors";
  FlipByte(f, 1);
  std::vector<float> m(layout_->total()), v(layout_->total());
  const auto data = LoadCheckpointTensors(dir, layout_->tensors(), nullptr, m.data(), v.data());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(m, m_);
  EXPECT_EQ(v, v_);
  std::vector<float> p(layout_->total());
  EXPECT_EQ(LoadCheckpointTensors(dir, layout_->tensors(), p.data(), nullptr, nullptr).status().code(),
            absl::StatusCode::kDataLoss);
}

// A header whose tensors share bytes (the format forbids it), its size and CRC listed correctly.
TEST_F(CheckpointTest, TensorsSharingBytesAreCorrupt) {
  const std::string dir = Saved();
  const fs::path f = fs::path(dir) / "model.safetensors";
  std::string bytes = *ReadWholeFile(f.string());
  const uint64_t len = SafetensorsHeaderLength(bytes);
  nlohmann::ordered_json header = nlohmann::ordered_json::parse(bytes.substr(8, len));
  header["h.0.ln_1.bias"]["data_offsets"] = header["h.0.ln_1.weight"]["data_offsets"];
  std::string json = header.dump();
  json.append(len - json.size(), ' ');  // the same length: the offsets' digits are the same count or fewer
  bytes.replace(8, len, json);
  std::ofstream(f, std::ios::binary | std::ios::trunc) << bytes;
  nlohmann::json state = nlohmann::json::parse(*ReadWholeFile((fs::path(dir) / "state.json").string()));
  state["files"]["model.safetensors"]["crc32"] = Crc32(bytes);
  std::ofstream(fs::path(dir) / "state.json", std::ios::trunc) << state.dump();
  const absl::Status s = Load(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("two tensors share bytes"), std::string::npos) << s;
}

TEST_F(CheckpointTest, GarbageStateFileAndMissingCheckpoint) {
  const std::string dir = Saved();
  std::ofstream(fs::path(dir) / "state.json", std::ios::trunc) << "{not json";
  absl::Status s = Load(dir);
  EXPECT_NE(s.message().find("state.json is corrupt"), std::string::npos) << s;
  EXPECT_EQ(LatestCheckpoint((root_ / "nothing").string()).status().code(), absl::StatusCode::kNotFound);
}

// JSON that parses but is not what longhaul writes: DataLoss naming the file, never a throw.
TEST_F(CheckpointTest, StateFileWithWrongFieldsIsDataLoss) {
  const std::string dir = Saved();
  const fs::path state = fs::path(dir) / "state.json";
  const std::string files = R"("files": {"model.safetensors": {"bytes": 10, "crc32": 1}})";
  for (const std::string& text :
       {std::string(R"([1, 2])"), std::string(R"({"format_version": "1", "step": 1, )") + files + "}",
        std::string(R"({"format_version": 1, "step": "42", )") + files + "}",
        std::string(R"({"format_version": 1, "step": -1, )") + files + "}",
        std::string(R"({"format_version": 1, "step": 42, "files": [1]})"),
        std::string(R"({"format_version": 1, "step": 42, "files": {"model.safetensors": {"bytes": "10"}}})"),
        std::string(R"({"format_version": 1, "step": 42, "files": {"model.safetensors": {"bytes": 1, "crc32": 99999999999}}})"),
        std::string(R"({"format_version": 1, "step": 42, "run_config": 3, )") + files + "}"}) {
    std::ofstream(state, std::ios::trunc) << text;
    absl::Status s = Load(dir);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << text << ": " << s;
    EXPECT_NE(s.message().find(state.string() + " is corrupt"), std::string::npos) << s;
    EXPECT_EQ(ReadCheckpointState(dir).status().code(), absl::StatusCode::kDataLoss) << text;
  }
  std::ofstream(state, std::ios::trunc) << R"({"format_version": 7, "step": 1, "files": {}})";
  EXPECT_EQ(Load(dir).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CheckpointTest, StepComesFromTheDirectoryNameChecked) {
  const std::string dir = Saved();
  EXPECT_EQ(*CheckpointStep(dir), 42);
  EXPECT_EQ(ReadCheckpointState(dir)->step, 42);
  for (const char* bad : {"step_", "step_12x", "latest", "step_-4", "step_99999999999999999999999"}) {
    EXPECT_FALSE(CheckpointStep(bad).ok()) << bad;
  }
  std::ofstream(root_ / "latest", std::ios::trunc) << "garbage\n";
  absl::Status s = LatestCheckpoint(root_.string()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("names \"garbage\", not a checkpoint directory"), std::string::npos) << s;
}

TEST_F(CheckpointTest, DifferentModelIsRefusedWithTheTensorNamed) {
  const std::string dir = Saved();
  ModelConfig other = cfg_;
  other.d_model = 16;
  ParamLayout l(other, StageSpec::Whole(other));
  std::vector<float> p(l.total());
  absl::Status s = LoadCheckpoint(dir, l, p.data(), nullptr, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("wte.weight has shape [16, 8] but the model expects [16, 16]"), std::string::npos) << s;
}

// Pruning keeps the newest complete steps in the root and in each shard's directory, never a step
// newer than the one complete everywhere (it may still be written), and keeps all with keep 0.
TEST_F(CheckpointTest, PruningKeepsTheNewestCompleteSteps) {
  const fs::path shard = root_ / "stage_0_shard_0";
  for (int64_t step : {10, 20, 30, 40}) {
    fs::create_directories(shard / CheckpointName(step));
    fs::create_directories(root_ / CheckpointName(step));
  }
  ASSERT_TRUE(PruneCheckpoints(root_.string(), 30, 0).ok());
  EXPECT_TRUE(fs::exists(shard / CheckpointName(10)));
  ASSERT_TRUE(PruneCheckpoints(root_.string(), 30, 2).ok());
  for (const fs::path& dir : {shard, root_}) {
    EXPECT_FALSE(fs::exists(dir / CheckpointName(10))) << dir;
    EXPECT_TRUE(fs::exists(dir / CheckpointName(20))) << dir;
    EXPECT_TRUE(fs::exists(dir / CheckpointName(30))) << dir;
    EXPECT_TRUE(fs::exists(dir / CheckpointName(40))) << dir << ": newer than the complete step";
  }
}

ino_t Inode(const fs::path& file) {
  struct stat st {};
  EXPECT_EQ(::stat(file.c_str(), &st), 0) << file;
  return st.st_ino;
}

TEST_F(CheckpointTest, APrunedStepsFilesAreWrittenOverByTheNextCheckpoint) {
  for (int64_t step : {1, 2}) {
    ASSERT_TRUE(SaveCheckpoint(root_.string(), {step, nlohmann::json::object()}, *layout_, p_.data(), m_.data(), v_.data()).ok());
  }
  ASSERT_TRUE(PruneCheckpoints(root_.string(), 2, 1).ok());
  EXPECT_FALSE(fs::exists(root_ / CheckpointName(1)));
  const ino_t recycled = Inode(root_ / "recycled" / "model.safetensors");
  // A smaller model and no moments: the recycled model file is cut to size and the optimizer's
  // file goes.
  ModelConfig small = cfg_;
  small.n_layer = 1;
  const ParamLayout layout(small, StageSpec::Whole(small));
  std::vector<float> q(layout.total());
  for (size_t i = 0; i < q.size(); ++i) q[i] = 3.0f - i;
  ASSERT_TRUE(SaveCheckpoint(root_.string(), {3, nlohmann::json::object()}, layout, q.data(), nullptr, nullptr).ok());
  const fs::path dir = root_ / CheckpointName(3);
  EXPECT_FALSE(fs::exists(root_ / "recycled"));
  EXPECT_EQ(Inode(dir / "model.safetensors"), recycled) << "written over in place";
  EXPECT_FALSE(fs::exists(dir / "optimizer.safetensors"));
  std::vector<float> loaded(q.size());
  const absl::StatusOr<CheckpointData> data = LoadCheckpoint(dir.string(), layout, loaded.data(), nullptr, nullptr);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(loaded, q);
  // Step 2 is intact.
  EXPECT_TRUE(Load((root_ / CheckpointName(2)).string()).ok());
}

// Names that arrive over the network (a shipped or fetched piece) are only the three a cluster
// writes, spelled as it spells them: nothing that reaches outside a run directory.
TEST(CheckpointPieceRoot, OnlyTheNamesAClusterWritesParse) {
  using Kind = CheckpointPieceRoot::Kind;
  for (auto [name, kind, stage, index] : {std::tuple{"stage_0_shard_1", Kind::kShard, 0, 1},
                                          {"residual_stage_3_replica_12", Kind::kResidual, 3, 12},
                                          {"local_stage_1_replica_0", Kind::kLocal, 1, 0}}) {
    const absl::StatusOr<CheckpointPieceRoot> piece = ParseCheckpointPieceRoot(name);
    ASSERT_TRUE(piece.ok()) << name << ": " << piece.status();
    EXPECT_EQ(piece->kind, kind) << name;
    EXPECT_EQ(piece->stage, stage) << name;
    EXPECT_EQ(piece->index, index) << name;
  }
  for (const char* name : {"", "..", "stage_0_shard_1/..", "../stage_0_shard_1", "stage_01_shard_1", "stage_-1_shard_0",
                           "stage_+1_shard_0", "stage_0_shard_", "stage_0_replica_1", "residual_stage_0_shard_1",
                           "local_stage_0_replica_1 ", "stage_99999999999_shard_0", "checkpoints"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseCheckpointPieceRoot(name).status())) << "\"" << name << "\" parsed";
  }
}

// What a piece's files may weigh bounds what a worker or the coordinator accepts over the network.
TEST_F(CheckpointTest, APiecesFilesFitTheirBoundAndOnlyCheckpointFilesHaveOne) {
  const std::string dir = Saved();
  const size_t tensors = layout_->tensors().size();
  for (const char* file : {"model.safetensors", "optimizer.safetensors", "state.json"}) {
    const absl::StatusOr<uint64_t> most = MaxCheckpointFileBytes(file, layout_->total(), tensors, true);
    ASSERT_TRUE(most.ok()) << file;
    EXPECT_LE(fs::file_size(fs::path(dir) / file), *most) << file;
    EXPECT_LT(*most, (uint64_t{64} << 20)) << file;
  }
  EXPECT_GE(*MaxCheckpointFileBytes("model.safetensors", layout_->total(), tensors, true), 4 * layout_->total());
  EXPECT_FALSE(MaxCheckpointFileBytes("optimizer.safetensors", layout_->total(), tensors, false).ok());
  EXPECT_FALSE(MaxCheckpointFileBytes("../job_state.pb", layout_->total(), tensors, true).ok());
  EXPECT_FALSE(MaxCheckpointFileBytes("latest", layout_->total(), tensors, true).ok());
}

TEST(Safetensors, RejectsGarbage) {
  EXPECT_EQ(ParseSafetensors("x", "abc").status().code(), absl::StatusCode::kDataLoss);
  std::string huge_header("\xff\xff\xff\xff\x00\x00\x00\x00{}", 10);
  EXPECT_EQ(ParseSafetensors("x", huge_header).status().code(), absl::StatusCode::kDataLoss);
  std::string bad_json("\x02\x00\x00\x00\x00\x00\x00\x00{[", 10);
  EXPECT_EQ(ParseSafetensors("x", bad_json).status().code(), absl::StatusCode::kDataLoss);
  // Headers that parse as JSON but whose shapes and offsets are not sizes: DataLoss, never a throw.
  for (const std::string header :
       {R"({"t": {"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]}})",
        R"({"t": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}})",
        R"({"t": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})",
        R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": {"a": 0}}})",
        R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})",
        R"({"t": {"dtype": "F32", "shape": [4294967296, 4294967296, 4], "data_offsets": [0, 0]}})"}) {
    std::string bytes(8, '\0');
    bytes[0] = static_cast<char>(header.size());
    bytes += header + std::string(8, '\0');
    EXPECT_EQ(ParseSafetensors("x", bytes).status().code(), absl::StatusCode::kDataLoss) << header;
  }
}

}  // namespace
}  // namespace longhaul
