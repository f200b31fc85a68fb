"""The official `openai` Python client against a running `xfuser serve` (tests/test_serve.cpp).

Usage: serve_openai_client.py BASE_URL API_KEY MODE OUT_DIR
  MODE images: images.generate (b64_json and url), the pictures written as OUT_DIR/openai_{k}.png;
               a bad request raised as openai.BadRequestError with the field named.
  MODE videos: videos.create, polled with videos.retrieve, the MP4 saved with
               videos.download_content as OUT_DIR/openai.mp4; then videos.delete.
Prints one JSON line of what it saw; exits non-zero on any unexpected answer.
"""
import base64
import json
import sys
import time
import urllib.request

import openai


def main():
    base_url, api_key, mode, out_dir = sys.argv[1:5]
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=300)
    seen = {}
    models = client.models.list()
    seen["models"] = [m.id for m in models.data]
    model = seen["models"][0]
    if mode == "images":
        result = client.images.generate(
            model=model,
            prompt="a large red circle in the center on a blue background",
            n=2,
            size="96x96",
            response_format="b64_json",
            extra_body={"seed": 11, "num_inference_steps": 8},
        )
        for k, item in enumerate(result.data):
            with open(f"{out_dir}/openai_{k}.png", "wb") as f:
                f.write(base64.b64decode(item.b64_json))
        seen["b64_images"] = len(result.data)
        result = client.images.generate(
            model=model,
            prompt="a large red circle in the center on a blue background",
            size="96x96",
            response_format="url",
            extra_body={"seed": 11, "num_inference_steps": 8},
        )
        with urllib.request.urlopen(urllib.request.Request(
                result.data[0].url, headers={"Authorization": f"Bearer {api_key}"})) as r:
            with open(f"{out_dir}/openai_url.png", "wb") as f:
                f.write(r.read())
        seen["url"] = result.data[0].url
        try:
            client.images.generate(model=model, prompt="x", size="100x100")
            raise SystemExit("a 100x100 picture was accepted")
        except openai.BadRequestError as e:
            seen["bad_request"] = {"status": e.status_code, "param": e.body.get("param")}
    elif mode == "videos":
        video = client.videos.create(model=model, prompt="a cat",
                                     extra_body={"seed": 5, "num_frames": 9})
        while video.status in ("queued", "in_progress"):
            time.sleep(0.2)
            video = client.videos.retrieve(video.id)
        seen["status"] = video.status
        content = client.videos.download_content(video.id)
        content.write_to_file(f"{out_dir}/openai.mp4")
        seen["deleted"] = client.videos.delete(video.id).deleted
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
