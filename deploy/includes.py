#!/usr/bin/env python3
"""Each source file includes the Abseil header of every Abseil name it uses (its own header twin
counts), so a newer Abseil that stops including one header from another does not break the build.
Fails naming each file, the name and the header to add.
"""
import os, re, sys

HEADERS = {
    r'absl::(StrCat|StrAppend)\b': 'absl/strings/str_cat.h',
    r'absl::(StrFormat|PrintF|FPrintF|StrAppendFormat)\b': 'absl/strings/str_format.h',
    r'absl::StrSplit\b': 'absl/strings/str_split.h',
    r'absl::StrJoin\b': 'absl/strings/str_join.h',
    r'absl::StrReplaceAll\b': 'absl/strings/str_replace.h',
    r'absl::(SimpleAtoi|SimpleAtod|SimpleAtof)\b': 'absl/strings/numbers.h',
    r'absl::(StartsWith|EndsWith|StrContains)\b': 'absl/strings/match.h',
    r'absl::(AsciiStrToLower|AsciiStrToUpper|StripAsciiWhitespace)\b': 'absl/strings/ascii.h',
    r'absl::(BytesToHexString|HexStringToBytes|Base64\w*)\b': 'absl/strings/escaping.h',
    r'absl::string_view\b': 'absl/strings/string_view.h',
    r'absl::Cord\b': 'absl/strings/cord.h',
    r'absl::StatusOr\b': 'absl/status/statusor.h',
    r'absl::(Status\b|\w+Error\()': 'absl/status/status.h',
    r'absl::(Mutex|MutexLock|ReaderMutexLock|WriterMutexLock|CondVar)\b': 'absl/synchronization/mutex.h',
    r'absl::Notification\b': 'absl/synchronization/notification.h',
    r'absl::flat_hash_map\b': 'absl/container/flat_hash_map.h',
    r'absl::flat_hash_set\b': 'absl/container/flat_hash_set.h',
    r'absl::btree_map\b': 'absl/container/btree_map.h',
    r'absl::InlinedVector\b': 'absl/container/inlined_vector.h',
    r'absl::Span\b': 'absl/types/span.h',
    r'absl::optional\b': 'absl/types/optional.h',
    r'absl::Cleanup\b': 'absl/cleanup/cleanup.h',
    r'absl::(Now\(|Duration\b|Time\b|Seconds\(|Milliseconds\()': 'absl/time/time.h',
}
FOLDERS = ['runtime', 'worker', 'coordinator', 'netem', 'cli', 'tests', 'bench']


def included(path):
    if not os.path.exists(path):
        return set()
    return set(re.findall(r'#include\s+"([^"]+)"', open(path).read()))


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
    missing = 0
    for folder in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for name in sorted(files):
                if not name.endswith(('.cc', '.h', '.cu', '.cuh')):
                    continue
                path = os.path.join(dirpath, name)
                code = re.sub(r'//.*', '', open(path).read())
                have = included(path) | included(re.sub(r'\.(cc|cu)$', '.h', path))
                for pattern, header in HEADERS.items():
                    used = re.search(pattern, code)
                    if used and header not in have:
                        print(f'{os.path.relpath(path, root)}: uses {used.group(0).rstrip("(")} '
                              f'but does not include "{header}": add it')
                        missing += 1
    print(f'includes: {missing} missing' if missing else 'includes: every Abseil name has its header')
    return 1 if missing else 0


if __name__ == '__main__':
    sys.exit(main())
