#!/bin/bash
# Wheels for eval/device-serving.sh, into .whl (git-ignored; carried to the device, which reaches
# no registry): guidellm 0.3.1 and the packages of its that the device's image lacks or holds at
# other versions (its image has transformers, tokenizers, numpy, pyarrow, pandas, httpx, rich,
# protobuf, pyyaml, sentencepiece). The versions are those `pip install guidellm==0.3.1` resolved
# on 2026-11-30, for the image's Python 3.12. ~5 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir .whl
for s in guidellm==0.3.1 click==8.1.8 datasets==5.0.1 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.6.0 \
  ftfy==6.3.1 wcwidth==0.9.4 loguru==0.7.3 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
  typing-inspection==0.4.5 typing-extensions==4.16.0 pydantic-settings==2.16.3 python-dotenv==1.2.4 \
  h2==4.4.1 hpack==4.2.0 hyperframe==6.1.0; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$s"
done
du -sh .whl
