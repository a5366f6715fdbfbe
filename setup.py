"""ament_python package oxygen_ros: pi0.5 with OxyGen unified KV cache management on ROS 2."""

from glob import glob

from setuptools import find_packages, setup

PACKAGE = 'oxygen_ros'

setup(
    name=PACKAGE,
    version='0.1.0',
    packages=find_packages(include=[PACKAGE, f'{PACKAGE}.*']),
    data_files=[
        ('share/ament_index/resource_index/packages', [f'resource/{PACKAGE}']),
        (f'share/{PACKAGE}', ['package.xml']),
        (f'share/{PACKAGE}/launch', glob('launch/*.launch.py')),
        (f'share/{PACKAGE}/config', glob('config/*.yaml') + glob('config/*.xml')
         + glob('config/*.json')),
    ],
    python_requires='>=3.11',
    install_requires=['setuptools'],
    zip_safe=True,
    maintainer='oxygen_ros maintainers',
    maintainer_email='maintainers@users.noreply.a-seed-0a1f5226.example',
    description='pi0.5 VLA on ROS 2 with OxyGen unified KV cache management',
    license='Apache-2.0',
    extras_require={'test': ['pytest']},
    entry_points={
        'console_scripts': [
            'oxygen_node = oxygen_ros.ros.node:main',
            'oxygen_replay = oxygen_ros.tools.replay:main',
            'oxygen_record = oxygen_ros.tools.record:main',
            'oxygen_make_demo_bag = oxygen_ros.tools.make_demo_bag:main',
            'oxygen-demo = oxygen_ros.tools.demo:main',
            'oxygen-bench = oxygen_ros.tools.bench:main',
            'oxygen-model-bench = oxygen_ros.tools.model_bench:main',
            'oxygen-gpu-check = oxygen_ros.tools.gpu_check:main',
            'oxygen-jitter-bench = oxygen_ros.tools.jitter_bench:main',
            'oxygen-export = oxygen_ros.tools.export:main',
            'oxygen-fetch-tokenizer = oxygen_ros.tools.fetch_tokenizer:main',
            'oxygen-run-model = oxygen_ros.tools.run_model:main',
            'oxygen-sim = oxygen_ros.sim.app:main',
            'oxygen-sim-demo = oxygen_ros.tools.sim_demo:main',
            'oxygen-fetch-sim-assets = oxygen_ros.tools.fetch_sim_assets:main',
            'oxygen-ask = oxygen_ros.tools.ask:main',
            'oxygen-decode-bench = oxygen_ros.tools.decode_bench:main',
            'oxygen-soak = oxygen_ros.tools.soak:main',
            'oxygen-flood = oxygen_ros.tools.flood:main',
        ],
    },
)
