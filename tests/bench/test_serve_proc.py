"""The benchmarks start this server as the README does: the variables before `serve run` in its start
command, and a Ray instance of their own."""

from bench.serve_proc import ours_env, readme_start_env, readme_start_line


def test_the_readme_start_variables_are_read_from_its_command():
    env = readme_start_env()
    assert readme_start_line().endswith(
        " ".join(f"{k}={v}" for k, v in env.items()) + " serve run serve_config.yaml"
    )
    assert env["RAY_worker_niceness"] == "0" and env["RAY_SERVE_ENABLE_HA_PROXY"] == "1"


def test_a_benchmarked_server_gets_them_and_a_ray_instance_of_its_own():
    base = {
        "PATH": "/bin",
        "RAY_ADDRESS": "auto",
        "OPENBLAS_NUM_THREADS": "7",
        "RAY_SERVE_ENABLE_HA_PROXY": "0",
    }
    env = ours_env(base)
    assert env["PATH"] == "/bin" and "OPENBLAS_NUM_THREADS" not in env
    assert env["RAY_ADDRESS"] == "local" and env["RAY_USAGE_STATS_ENABLED"] == "0"
    assert {k: env[k] for k in readme_start_env()} == readme_start_env()  # the README's win over the shell's
