# Writes OUT (a header defining LONGHAUL_VERSION_TEXT) from VERSION, the build type, whether the
# CUDA backend is built, and the git commit of SOURCE_DIR (with "+changes" for uncommitted edits
# to tracked files; "no git checkout" where there is none, as in a container build). The file is
# rewritten only when its text changes, so only the file printing it recompiles after a commit.
execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse --short=12 HEAD
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE no_git ERROR_QUIET)
if(no_git)
  set(commit "no git checkout")
else()
  execute_process(COMMAND git -C "${SOURCE_DIR}" status --porcelain --untracked-files=no
                  OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(changes)
    string(APPEND commit "+changes")
  endif()
endif()
set(text "longhaul ${VERSION} (commit ${commit}, ${BUILD_TYPE} build, CUDA backend ${CUDA})")
file(WRITE "${OUT}.new" "#define LONGHAUL_VERSION_TEXT \"${text}\"\n")
file(COPY_FILE "${OUT}.new" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.new")
